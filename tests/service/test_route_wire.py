"""The Route path (serialized RouteRequest in, RouteResponse out) against
`Router.route` on the same state: every field must match, which also checks
the core's message layout against proto/router.proto. Both go through the
core's one decision path, so both are counted and logged alike."""

from __future__ import annotations

import json

import pytest

from kvrouter._core import PrefixIndex, RouteRefused, Stored, hash_tokens
from kvrouter.policy import PolicyConfig, Router
from kvrouter.proto_gen import router_pb2 as pb

BS = 4
CACHED = list(range(40))
WORKERS = {1: "decode", 2: "decode", 3: "prefill", 4: "prefill"}


def new_router(config: PolicyConfig, *, log_decisions: bool = True) -> Router:
    return Router(
        PrefixIndex(BS),
        config.replace(approximate_ttl_s=0.0),
        id_prefix="t",
        log_decisions=log_decisions,
        max_prompt_tokens=1000,
        max_namespace_chars=16,
        max_request_id_chars=32,
    )


def deployment(config: PolicyConfig) -> Router:
    router = new_router(config)
    for worker, role in WORKERS.items():
        router.upsert_worker(worker, role, 10_000, f"10.0.0.{worker}:9000")
    blocks = hash_tokens(CACHED, BS, "m")
    router.index.apply(2, 0, [Stored(blocks, CACHED, namespace="m")])
    router.index.apply(3, 0, [Stored(blocks[:4], CACHED[:16], namespace="m")])
    return router


def candidate_fields(c) -> dict:
    fields = c.to_dict()
    del fields["overlap"]
    return {**fields, "role": WORKERS[c.worker_id]}


@pytest.mark.parametrize("split", [False, True], ids=["aggregated", "disaggregated"])
@pytest.mark.parametrize("explain", [False, True])
@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
def test_core_response_equals_the_python_policy(split, explain, busy):
    config = PolicyConfig(local_prefill_max_tokens=0 if split else 1 << 20)
    reference = deployment(config)
    router = deployment(config)
    if busy:
        # Requests in flight: their workers' candidates carry the terms they cause.
        for r in (reference, router):
            for i in range(5):
                r.route(f"before-{i}", list(range(1000 + 100 * i, 1300 + 100 * i)), "m")
    prompt = CACHED + list(range(500, 540))
    expected = reference.route("r1", prompt, "m")

    request = pb.RouteRequest(request_id="r1", tokens=prompt, namespace="m", explain=explain)
    raw, request_id = router.route_wire(request.SerializeToString())
    got = pb.RouteResponse.FromString(raw)

    assert request_id == "r1"
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
    # Aggregated, the streams in flight on a candidate wait for this prefill.
    assert any(c.stall_ms > 0 for c in ex.decode_candidates) == (busy and not split)
    for sent, scored, chosen in (
        (got.explanation.decode_candidates, ex.decode_candidates, expected.decode_worker),
        (got.explanation.prefill_candidates, ex.prefill_candidates, expected.prefill_worker),
    ):
        want = [c for c in scored if explain or c.worker_id == chosen]
        assert [
            {f.name: getattr(c, f.name) for f in pb.Candidate.DESCRIPTOR.fields} for c in sent
        ] == [pytest.approx(candidate_fields(c)) for c in want]
    # The booking is the same too.
    assert router.load(got.decode_worker) == reference.load(expected.decode_worker)


def test_unnamed_requests_get_fresh_ids_and_duplicates_are_refused():
    router = deployment(PolicyConfig())
    payload = pb.RouteRequest(tokens=list(range(8))).SerializeToString()
    first, second = (router.route_wire(payload)[1] for _ in range(2))
    assert first != second and first.startswith("t-")
    named = pb.RouteRequest(request_id="same", tokens=[1]).SerializeToString()
    router.route_wire(named)
    with pytest.raises(RouteRefused) as refused:
        router.route_wire(named)
    code, message, request_id = refused.value.args
    assert (code, request_id) == ("INVALID_ARGUMENT", "same")
    assert "already routed" in message


def test_refusals_leave_the_book_and_index_alone_and_are_counted():
    router = deployment(PolicyConfig())
    router.index.wait_sized()
    before = [router.load(w) for w in WORKERS], router.index.stats()
    for payload in (b"\xff", pb.RouteRequest(namespace="m").SerializeToString()):
        with pytest.raises(RouteRefused):
            router.route_wire(payload)
    assert ([router.load(w) for w in WORKERS], router.index.stats()) == before
    stats = router.stats()
    assert stats.decisions == [] and stats.errors == [("INVALID_ARGUMENT", 2)]
    assert sum(stats.latency.counts) == sum(stats.overlap.counts) == 0


def test_no_worker_is_unavailable():
    router = new_router(PolicyConfig(), log_decisions=False)
    with pytest.raises(RouteRefused) as refused:
        router.route_wire(pb.RouteRequest(tokens=[1, 2]).SerializeToString())
    assert refused.value.args[0] == "UNAVAILABLE"
    assert router.stats().errors == [("UNAVAILABLE", 1)]


def test_decisions_are_counted_and_logged():
    router = deployment(PolicyConfig())
    prompt = pb.RouteRequest(request_id="r", tokens=CACHED, namespace="m")
    response = pb.RouteResponse.FromString(router.route_wire(prompt.SerializeToString())[0])
    decode, blocks = response.decode_worker, response.num_blocks
    stats = router.stats()
    assert stats.decisions == [(decode, "decode", 1)] and stats.errors == []
    assert sum(stats.latency.counts) == 1 and sum(stats.overlap.counts) == 1
    (line,) = router.take_decision_lines().splitlines()
    record = json.loads(line)
    assert (record["request_id"], record["decode_worker"], record["blocks"]) == (
        "r",
        decode,
        blocks,
    )
    assert record["overlap"] == (blocks if decode == 2 else 0)
    assert router.take_decision_lines() == ""


@pytest.mark.parametrize("path", ["route", "route_wire"])
def test_both_ways_in_are_counted_and_logged(path):
    router = deployment(PolicyConfig())
    if path == "route":
        decode = router.route("r", CACHED, "m").decode_worker
    else:
        request = pb.RouteRequest(request_id="r", tokens=CACHED, namespace="m")
        decode = pb.RouteResponse.FromString(
            router.route_wire(request.SerializeToString())[0]
        ).decode_worker
    assert router.stats().decisions == [(decode, "decode", 1)]
    (line,) = router.take_decision_lines().splitlines()
    assert json.loads(line)["request_id"] == "r"
