"""Heartbeats: a silent worker leaves routing and the index; when it comes
back it registers again and resyncs its KV events."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest
from waiting import wait_until

from kvrouter.client import RouterError, Unavailable, WorkerLoad, WorkerRegistration
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

from .helpers import BLOCK, prompt

FAST = dict(heartbeat_interval_s=0.05, heartbeat_ttl_s=0.5)


def worker_ids(router) -> list[int]:
    return [w.worker_id for w in router.client().list_workers()]


def test_a_heartbeat_lapse_removes_the_worker(start_router):
    router = start_router(**FAST)
    with grpc.insecure_channel(router.target) as channel:
        registry = router_pb2_grpc.RegistryStub(channel)
        registry.Register(
            pb.RegisterRequest(
                worker_id=3, role=pb.ROLE_BOTH, block_size=BLOCK, capacity_blocks=100
            )
        )
    router.worker(4)  # keeps heartbeating
    assert worker_ids(router) == [3, 4]

    wait_until(lambda: worker_ids(router) == [4], what="worker 3 to expire")
    for _ in range(5):
        assert router.client().route(prompt(seed=1, blocks=2)).decode_worker == 4


def test_a_lapsed_worker_returns_and_resyncs(start_router):
    router = start_router(**FAST)
    cache: list[tuple[int | None, list[int], list[int]]] = []
    lock = threading.Lock()

    def dump_cache(sink) -> None:
        with lock:
            for parent, block_ids, tokens in cache:
                sink.stored(parent, block_ids, tokens)

    tokens = prompt(seed=5, blocks=4)
    first = router.worker(1)
    publisher = router.publisher(1, dump_cache=dump_cache)
    with lock:
        cache.append((None, [1, 2, 3, 4], tokens))
    publisher.stored(None, [1, 2, 3, 4], tokens)
    assert publisher.flush(10)

    first.stop_background(deregister=False)  # the worker goes silent
    wait_until(lambda: worker_ids(router) == [], what="worker 1 to expire")
    assert router.on_loop(lambda: router.server.index.stats()["workers"]) == 0
    with pytest.raises(Unavailable):
        router.client().route(tokens)

    again = WorkerRegistration(
        router.target, role="both", capacity_blocks=10_000, worker_id=1, block_size=BLOCK
    )
    again.start_background()
    try:
        wait_until(lambda: publisher.dumps_sent >= 1, what="the resync dump")
        wait_until(
            lambda: router.client().list_workers()[0].index_blocks == 4,
            what="the dump to be applied",
        )
        result = router.client().route(tokens, explain=True)
        assert result.decode_worker == 1
        assert result.explanation.decode_candidates[0].overlap == 4
    finally:
        again.stop_background(deregister=False)


def test_heartbeats_carry_load_and_reregister_after_a_router_restart(start_router):
    router = start_router(**FAST)
    load = WorkerLoad(queued_prefill_tokens=7, active_decode_blocks=1, active_requests=1)
    registration = router.worker(2, load=lambda: load)
    wait_until(
        lambda: router.client().list_workers()[0].queued_prefill_tokens == 7,
        what="a heartbeat with load",
    )
    # The router forgets the worker (as after a restart without a snapshot).
    router.on_loop(router.server.workers.remove, 2, "test")
    # The router lists the worker as soon as it has taken the Register, a
    # moment before the worker's own thread counts the reply: wait for both.
    wait_until(
        lambda: registration.registrations >= 2 and worker_ids(router) == [2],
        what="re-registration",
    )


def test_a_new_capacity_registers_again_and_a_refused_one_is_not_kept(start_router):
    """An engine restarted with another cache size: its worker registers
    again with the new capacity. If another process has since taken the
    id, the router refuses, and the worker keeps the capacity it had, so
    that a later call tries again."""
    router = start_router(**FAST)

    def capacity() -> int:
        (worker,) = router.client().list_workers()
        return worker.capacity_blocks

    async def scenario():
        first = WorkerRegistration(
            router.target, role="both", capacity_blocks=100, block_size=BLOCK, worker_id=5
        )
        other = WorkerRegistration(
            router.target, role="both", capacity_blocks=50, block_size=BLOCK, worker_id=5
        )
        await first.start()
        try:
            await first.set_capacity(300)
            assert capacity() == 300
            await other.start()
            with pytest.raises(RouterError, match="registered by another process"):
                await first.set_capacity(400)
            assert (first.capacity_blocks, capacity()) == (300, 50)
        finally:
            await first.stop(deregister=False)
            await other.stop()

    asyncio.run(scenario())


def test_a_returning_worker_without_events_is_routable_again(start_router):
    router = start_router(**FAST)
    request = pb.RegisterRequest(
        worker_id=6, role=pb.ROLE_BOTH, block_size=BLOCK, capacity_blocks=100
    )
    with grpc.insecure_channel(router.target) as channel:
        registry = router_pb2_grpc.RegistryStub(channel)
        registry.Register(request)
        wait_until(lambda: worker_ids(router) == [], what="worker 6 to expire")
        registry.Register(request)
    assert router.client().list_workers()[0].routable
    assert router.client().route(prompt(seed=2, blocks=2)).decode_worker == 6
