"""An engine server whose data-parallel ranks share one address (vLLM's
internal load balancing), each rank registered as a worker of its own:
every request names the rank the router chose in `X-data-parallel-rank`,
so that rank computes it, and List shows each worker's rank."""

from __future__ import annotations

import asyncio

from serve_process import ServeProcess

from kvrouter.client import RouterClient
from kvrouter.client.generate import GenerateClient

from .helpers import MODEL, register
from .stub import StubEngine

RANKS = (0, 1)


def test_each_request_names_the_rank_it_was_routed_to():
    router = ServeProcess()
    engine = StubEngine(list(range(40, 60))).start()
    other = StubEngine(list(range(70, 90))).start()
    registrations = [register(router.target, engine, data_parallel_rank=r) for r in RANKS]
    plain = register(router.target, other)
    rank_of = {reg.worker_id: str(rank) for reg, rank in zip(registrations, RANKS, strict=True)}
    try:
        with RouterClient(router.target) as client:
            listed = {w.worker_id: w.data_parallel_rank for w in client.list_workers()}
        assert listed == {**{w: int(r) for w, r in rank_of.items()}, plain.worker_id: None}

        async def generate() -> list[int]:
            async with GenerateClient(router.target, model=MODEL) as client:
                return [
                    (await client.generate([i + 1, 2, 3], max_tokens=2)).decode_worker
                    for i in range(9)
                ]

        routed = asyncio.run(generate())
        to_engine = [w for w in routed if w in rank_of]
        assert set(to_engine) == set(rank_of)  # both ranks were chosen
        assert engine.dp_ranks == [rank_of[w] for w in to_engine]
    finally:
        for registration in (*registrations, plain):
            registration.stop_background()
        engine.stop()
        other.stop()
        router.kill()
