"""A request split between two engines that registered vLLM's P/D
protocol (KV_TRANSFER_VLLM), against stub engines on 127.0.0.1 and a real
`kvrouter serve`: P is sent the prompt with max_tokens 1 and
kv_transfer_params asking for a remote decode, D the request with P's
kv_transfer_params; P failing in any way serves the request whole on D,
and every booking closes."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest
from serve_process import ServeProcess
from waiting import wait_until

from kvrouter.client import RouterClient, WorkerLoad
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

from .helpers import (
    booked,
    generate,
    prefill_booked,
    probe,
    register,
    split_engines,
    split_pair,
    split_router,
)
from .stub import StubEngine

PROMPT = [random.Random(5).randrange(3, 256) for _ in range(200)]


@pytest.fixture(scope="module")
def router():
    process = split_router()
    yield process
    process.kill()


@pytest.fixture(scope="module")
def engines(router):
    yield from split_engines(router.target, "vllm")


@pytest.fixture
def pair(router, engines):
    yield from split_pair(router.target, engines, PROMPT)


def test_prefill_engine_hands_its_kv_to_the_decode_engine(router, pair):
    prefill, decode, prefill_id, decode_id = pair
    answer = generate(router.target, PROMPT)
    assert answer.token_ids == decode.tokens[:5]
    assert (answer.prefill_worker, answer.decode_worker) == (prefill_id, decode_id)
    assert answer.stats.disaggregated and answer.stats.retries == 0
    (asked,) = prefill.received
    assert asked["prompt"] == PROMPT
    assert (asked["max_tokens"], asked["stream"]) == (1, False)
    assert asked["kv_transfer_params"]["do_remote_decode"] is True
    (sent,) = decode.received
    assert sent["prompt"] == PROMPT
    assert (sent["max_tokens"], sent["stream"]) == (5, True)
    assert sent["kv_transfer_params"] == prefill.handed_off()
    assert prefill.request_ids == decode.request_ids and prefill.request_ids[0]


@pytest.mark.parametrize("mode", ["unavailable", "no_params", "hang", "refuse"])
def test_a_failed_prefill_is_served_whole_on_the_decode_engine(router, pair, mode):
    prefill, decode, _, decode_id = pair
    prefill.mode = mode
    answer = generate(router.target, PROMPT)
    assert answer.token_ids == decode.tokens[:5]
    assert (answer.prefill_worker, answer.decode_worker) == (None, decode_id)
    assert answer.stats.retries == 1 and not answer.stats.disaggregated
    assert len(prefill.received) == 1
    (sent,) = decode.received
    assert "kv_transfer_params" not in sent
    assert sent["max_tokens"] == 5


def test_the_prefill_booking_is_open_while_the_prefill_engine_works(router, pair):
    prefill, decode, _, _ = pair
    prefill.mode = "hang"

    async def run():
        task = asyncio.ensure_future(asyncio.to_thread(generate, router.target, PROMPT))
        await asyncio.to_thread(wait_until, lambda: prefill.received, what="the prefill to be sent")
        assert prefill_booked(router.target, PROMPT) > 0
        return await task

    answer = asyncio.run(run())
    assert answer.token_ids == decode.tokens[:5]


def test_the_split_protocol_is_registered_and_listed(router, engines):
    prefill, decode, prefill_id, decode_id = engines
    with RouterClient(router.target) as client:
        listed = {w.worker_id: (w.kv_transfer, w.bootstrap_port) for w in client.list_workers()}
    assert listed == {prefill_id: ("vllm", 0), decode_id: ("vllm", 0)}
    with grpc.insecure_channel(router.target) as channel:
        registry = router_pb2_grpc.RegistryStub(channel)
        for kv_transfer, protocol, port in (
            (pb.KV_TRANSFER_VLLM, pb.WORKER_PROTOCOL_KVROUTER, 0),
            (pb.KV_TRANSFER_SGLANG, pb.WORKER_PROTOCOL_OPENAI, 0),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                registry.Register(
                    pb.RegisterRequest(
                        role=pb.ROLE_PREFILL,
                        address=prefill.url if protocol else "127.0.0.1:1",
                        block_size=16,
                        capacity_blocks=100,
                        protocol=protocol,
                        kv_transfer=kv_transfer,
                        bootstrap_port=port,
                    ),
                    timeout=5,
                )
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_failed_prefill_engine_is_not_tried_again_while_it_cools_down(engines):
    prefill, decode, prefill_id, _ = engines
    prefill.mode = "hang"
    prefill.received.clear()
    process = ServeProcess(
        "--proxy",
        "prefill_timeout_s=2",
        "--proxy",
        "failure_cooldown_s=600",
        env={"KVROUTER_POLICY_LOCAL_PREFILL_MAX_TOKENS": "16"},
    )
    registrations = [
        register(process.target, prefill, role="prefill", kv_transfer="vllm"),
        register(process.target, decode, role="decode", kv_transfer="vllm"),
    ]
    try:
        wait_until(lambda: probe(process.target, PROMPT).disaggregated, what="a split decision")
        for _ in range(3):
            assert generate(process.target, PROMPT).token_ids == decode.tokens[:5]
        assert len(prefill.received) == 1, "a hung prefill engine was waited on again"
    finally:
        for registration in registrations:
            registration.stop_background()
        process.kill()
        prefill.mode = "ok"


def test_a_decode_engine_that_fails_the_split_passes_the_request_on_whole(engines):
    prefill, _, _, _ = engines
    prefill.received.clear()
    failing = StubEngine(list(range(40, 60))).start()
    healthy = StubEngine(list(range(140, 160))).start()
    failing.mode = "unavailable"
    # The healthy engine reports a long queue, so the router picks the failing one first.
    healthy.load = WorkerLoad(queued_prefill_tokens=1_000_000)
    process = ServeProcess(env={"KVROUTER_POLICY_LOCAL_PREFILL_MAX_TOKENS": "16"})
    registrations = [
        register(process.target, prefill, role="prefill", kv_transfer="vllm"),
        register(process.target, failing, role="decode", kv_transfer="vllm"),
        register(process.target, healthy, role="decode", kv_transfer="vllm"),
    ]
    try:
        wait_until(
            lambda: (
                probe(process.target, PROMPT).decode_worker == registrations[1].worker_id
                and probe(process.target, PROMPT).disaggregated
            ),
            what="a split onto the failing engine",
        )
        answer = generate(process.target, PROMPT)
        assert answer.token_ids == healthy.tokens[:5]
        assert (answer.prefill_worker, answer.decode_worker) == (None, registrations[2].worker_id)
        assert not answer.stats.disaggregated
        (asked,) = prefill.received
        (refused,) = failing.received
        (served,) = healthy.received
        assert refused["kv_transfer_params"] == prefill.handed_off()
        assert "kv_transfer_params" not in served
        wait_until(
            lambda: not any(booked(process.target).values()), what="every booking to be closed"
        )
    finally:
        for registration in registrations:
            registration.stop_background()
        process.kill()
        failing.stop()
        healthy.stop()
