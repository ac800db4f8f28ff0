"""The core's Route path (serialized RouteRequest in, RouteResponse out)
against the Python policy on the same state: every field must match, which
also checks the core's message layout against proto/router.proto."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvrouter._core import PrefixIndex, RouteRefused, Stored, WireRouter, hash_tokens
from kvrouter.policy import PolicyConfig, Router
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.service.metrics import LATENCY_BUCKETS, RATIO_BUCKETS

BS = 4
CACHED = list(range(40))
WORKERS = {1: "decode", 2: "decode", 3: "prefill", 4: "prefill"}


def wire_router(router: Router, *, log_decisions: bool = True) -> WireRouter:
    return WireRouter(
        router.core,
        router.index,
        id_prefix="t",
        max_prompt_tokens=1000,
        max_namespace_chars=16,
        max_request_id_chars=32,
        approximate_ttl_s=0.0,
        latency_buckets=LATENCY_BUCKETS,
        overlap_buckets=RATIO_BUCKETS,
        log_decisions=log_decisions,
    )


def deployment(config: PolicyConfig) -> tuple[Router, WireRouter]:
    router = Router(PrefixIndex(BS), config)
    wire = wire_router(router)
    for worker, role in WORKERS.items():
        router.upsert_worker(worker, role, 10_000)
        wire.set_worker(worker, role, f"10.0.0.{worker}:9000")
    blocks = hash_tokens(CACHED, BS, "m")
    router.index.apply(2, 0, [Stored(blocks, CACHED, namespace="m")])
    router.index.apply(3, 0, [Stored(blocks[:4], CACHED[:16], namespace="m")])
    return router, wire


def candidate_fields(c) -> dict:
    fields = {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
    return {**fields, "cost_ms": c.cost_ms, "role": WORKERS[c.worker_id]}


@pytest.mark.parametrize("split", [False, True], ids=["aggregated", "disaggregated"])
@pytest.mark.parametrize("explain", [False, True])
def test_core_response_equals_the_python_policy(split, explain):
    config = PolicyConfig(local_prefill_max_tokens=0 if split else 1 << 20)
    reference, _ = deployment(config)
    router, wire = deployment(config)
    prompt = CACHED + list(range(500, 540))
    expected = reference.route("r1", prompt, "m")

    request = pb.RouteRequest(request_id="r1", tokens=prompt, namespace="m", explain=explain)
    raw, request_id, decode, prefill, prefill_tokens, blocks = wire.route(
        request.SerializeToString(), router.clock()
    )
    got = pb.RouteResponse.FromString(raw)

    assert (request_id, decode, prefill) == ("r1", expected.decode_worker, expected.prefill_worker)
    assert (prefill_tokens, blocks) == (expected.prefill_tokens, expected.num_blocks)
    assert got.request_id == "r1" and got.decode_worker == expected.decode_worker
    assert got.disaggregated == split == expected.disaggregated
    assert got.HasField("prefill_worker") == split
    if split:
        assert got.prefill_worker == expected.prefill_worker
        assert got.prefill_address == f"10.0.0.{expected.prefill_worker}:9000"
    assert got.decode_address == f"10.0.0.{expected.decode_worker}:9000"
    assert got.num_blocks == expected.num_blocks
    assert got.predicted_ttft_ms == pytest.approx(expected.predicted_ttft_ms)
    ex = expected.explanation
    assert got.explanation.reason == ex.reason
    for sent, scored, chosen in (
        (got.explanation.decode_candidates, ex.decode_candidates, expected.decode_worker),
        (got.explanation.prefill_candidates, ex.prefill_candidates, expected.prefill_worker),
    ):
        want = [c for c in scored if explain or c.worker_id == chosen]
        assert [
            {f.name: getattr(c, f.name) for f in pb.Candidate.DESCRIPTOR.fields} for c in sent
        ] == [pytest.approx(candidate_fields(c)) for c in want]
    # The booking is the Python policy's too.
    assert router.load(decode) == reference.load(expected.decode_worker)


def test_unnamed_requests_get_fresh_ids_and_duplicates_are_refused():
    router, wire = deployment(PolicyConfig())
    payload = pb.RouteRequest(tokens=list(range(8))).SerializeToString()
    first, second = (wire.route(payload, router.clock())[1] for _ in range(2))
    assert first != second and first.startswith("t-")
    named = pb.RouteRequest(request_id="same", tokens=[1]).SerializeToString()
    wire.route(named, router.clock())
    with pytest.raises(RouteRefused) as refused:
        wire.route(named, router.clock())
    code, message, request_id = refused.value.args
    assert (code, request_id) == ("INVALID_ARGUMENT", "same")
    assert "already routed" in message


def test_refusals_leave_the_book_and_index_alone_and_are_counted():
    router, wire = deployment(PolicyConfig())
    before = [router.load(w) for w in WORKERS], router.index.stats()
    for payload in (b"\xff", pb.RouteRequest(namespace="m").SerializeToString()):
        with pytest.raises(RouteRefused):
            wire.route(payload, router.clock())
    assert ([router.load(w) for w in WORKERS], router.index.stats()) == before
    decisions, errors, latency, overlap = wire.stats()
    assert decisions == [] and errors == [("INVALID_ARGUMENT", 2)]
    assert sum(latency[0]) == sum(overlap[0]) == 0


def test_no_worker_is_unavailable():
    router = Router(PrefixIndex(BS))
    wire = wire_router(router, log_decisions=False)
    with pytest.raises(RouteRefused) as refused:
        wire.route(pb.RouteRequest(tokens=[1, 2]).SerializeToString(), 0.0)
    assert refused.value.args[0] == "UNAVAILABLE"


def test_decisions_are_counted_and_logged():
    router, wire = deployment(PolicyConfig())
    prompt = pb.RouteRequest(request_id="r", tokens=CACHED, namespace="m")
    _, _, decode, _, _, blocks = wire.route(prompt.SerializeToString(), router.clock())
    decisions, errors, latency, overlap = wire.stats()
    assert decisions == [(decode, "decode", 1)] and errors == []
    assert sum(latency[0]) == 1 and sum(overlap[0]) == 1
    (line,) = wire.take_decision_lines().splitlines()
    record = json.loads(line)
    assert (record["request_id"], record["decode_worker"], record["blocks"]) == (
        "r",
        decode,
        blocks,
    )
    assert record["overlap"] == (blocks if decode == 2 else 0)
    assert wire.take_decision_lines() == ""
