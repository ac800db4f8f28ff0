"""Replicas share their routing decisions over a real nats-server, so load
spreads through two replicas as it does through one router."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from kvrouter import PrefixIndex
from kvrouter.adapters.nats import NatsConfig
from kvrouter.policy import Router
from kvrouter.service.replicas import RouterReplica

from .conftest import until

pytest.importorskip("nats", reason="the adapters extra (nats-py) is not installed")

WORKERS = [1, 2, 3, 4, 5, 6, 7, 8]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def prompt(i: int) -> list[int]:
    return [(i * 1009 + t) % 50_000 for t in range(256)]


def spread(counts: Counter) -> int:
    return max(counts[w] for w in WORKERS) - min(counts[w] for w in WORKERS)


def register(router) -> None:
    for worker in WORKERS:
        router.upsert_worker(worker, "both", 10_000)


async def replicas(url: str):
    config = NatsConfig(servers=(url,))
    pair = [RouterReplica(config, "a"), RouterReplica(config, "b")]
    for replica in pair:
        await replica.start()
        register(replica.router)
    return pair


def test_alternating_replicas_spread_like_one_router(nats_url):
    async def scenario():
        a, b = await replicas(nats_url)
        single = Router(PrefixIndex(16))
        register(single)
        shared, alone = Counter(), Counter()
        for i in range(32):
            replica, other = (a, b) if i % 2 == 0 else (b, a)
            shared[replica.router.route(f"r{i}", prompt(i)).decode_worker] += 1
            await until(
                lambda i=i, r=replica, o=other: o.router.knows_remote(r.name, f"r{i}"),
                f"r{i} to reach the other replica",
            )
            alone[single.route(f"r{i}", prompt(i)).decode_worker] += 1
            assert spread(shared) == spread(alone) <= 1
        for i in range(32):
            (a if i % 2 == 0 else b).router.finished(f"r{i}")
        for replica, other in ((a, b), (b, a)):
            await until(
                lambda r=replica, o=other: not o.router.remote_bookings(r.name),
                "finished requests to reach the other replica",
            )
        for replica in (a, b):
            await replica.stop()

    run(scenario())


def test_without_sharing_the_same_traffic_piles_up():
    """The control for the test above: two routers that do not share."""
    a, b = Router(PrefixIndex(16)), Router(PrefixIndex(16))
    register(a)
    register(b)
    counts = Counter(
        (a if i % 2 == 0 else b).route(f"r{i}", prompt(i)).decode_worker for i in range(8)
    )
    assert spread(counts) >= 2


def test_simultaneous_routing_through_both_replicas_spreads_the_load(nats_url):
    """Each round the two replicas decide at the same moment, neither having
    seen the other's choice: the worst case of concurrent routing. Both may
    pick the same worker, so a round can add 2 to one worker, but sharing
    keeps the spread at that one collision instead of letting it grow."""

    async def scenario():
        a, b = await replicas(nats_url)
        chosen: Counter = Counter()
        for round_ in range(32):
            ids = {a: f"r{2 * round_}", b: f"r{2 * round_ + 1}"}
            for i, (replica, request) in enumerate(ids.items()):
                chosen[replica.router.route(request, prompt(2 * round_ + i)).decode_worker] += 1
            for replica, other in ((a, b), (b, a)):
                await until(
                    lambda r=replica, o=other, i=ids: o.router.knows_remote(r.name, i[r]),
                    f"{ids[replica]} to reach the other replica",
                )
        assert sum(chosen.values()) == 64
        assert spread(chosen) <= 2
        for replica in (a, b):
            await replica.stop()

    run(scenario())
