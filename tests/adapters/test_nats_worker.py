"""`kvrouter worker --nats URL --router A --router B`: a kvrouter worker in
front of two router replicas. It registers with both under one worker id,
publishes its KV events to their stream, and leaves both as it stops."""

from __future__ import annotations

import asyncio

import pytest
from threaded_worker import RunningWorker

from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint
from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.worker import WorkerConfig

from .conftest import until

pytest.importorskip("nats", reason="the adapters extra (nats-py) is not installed")

from .test_replica_service import BLOCK, CALL_S, replicas, run  # noqa: E402


def test_the_worker_joins_both_replicas_and_its_events_reach_both_indexes(nats_url, tmp_path):
    model = write_tiny_checkpoint(tmp_path / "tiny-llama", "llama", seed=3)
    tokens = [3 + (7 * t) % 250 for t in range(3 * BLOCK)]

    async def listed(replica) -> dict[int, str]:
        listing = await replica.registry.List(pb.ListWorkersRequest(), timeout=CALL_S)
        return {w.worker_id: w.address for w in listing.workers}

    def generate(worker: RunningWorker) -> None:
        request = gen.GenerateRequest(
            tokens=tokens, sampling=gen.SamplingParams(max_tokens=4, ignore_eos=True)
        )
        for _ in worker.stub.Generate(request, timeout=CALL_S):
            pass

    async def scenario():
        async with replicas(nats_url, "router-a", "router-b") as (r1, r2):
            config = WorkerConfig(
                model=str(model),
                block_size=BLOCK,
                routers=tuple(f"127.0.0.1:{r.server.server.port}" for r in (r1, r2)),
                nats=(nats_url,),
                num_kv_blocks=128,
                torch_threads=0,
            )
            # Its own thread: starting it blocks until both replicas (on this loop) answer.
            worker = await asyncio.to_thread(RunningWorker, config)
            try:
                worker_id = worker.server.identity.worker_id
                for replica in (r1, r2):
                    assert await listed(replica) == {worker_id: worker.address}
                await asyncio.to_thread(generate, worker)
                for replica in (r1, r2):
                    await until(
                        lambda r=replica: (
                            r.server.replica.index.find_matches_for_tokens(tokens).scores
                            == {worker_id: 3}
                        ),
                        f"the worker's prompt blocks in replica {replica.name}",
                    )
            finally:
                await asyncio.to_thread(worker.stop)
            for replica in (r1, r2):
                assert await listed(replica) == {}

    run(scenario())
