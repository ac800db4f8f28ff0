"""KV events captured from a real vLLM, played back over real ZMQ sockets
into the sidecar and a real router: for every probe prompt, the router's
overlap on the engine's worker is vLLM's own prefix hit, never more, and
less only where docs/deployment.md says why (`expect = "at_most"`)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import zmq

from kvrouter.adapters.vllm.sidecar import VllmSidecar
from kvrouter.client import AsyncRouterClient
from kvrouter.service import RouterServer, ServiceConfig

from .captured_engine import CapturedEngine, load_capture
from .conftest import until
from .engine_http import EngineHttp
from .test_vllm_events import run

VERSION = "0.33.0"
SCENARIOS = (
    "prefix_caching",
    "reset",
    "extra_keys",
    "cache_salt",
    "hybrid_sliding_window",
    "hybrid_mamba",
    "hybrid_chunked_local",
    "spec_decode_lookahead",
    "dp_ranks_0_1",
    "dp_start_rank_1",
    "offload_placeholder",
    "offload_self_describing",
)
TIERS = {"device": 0, "host": 1, "disk": 2}


async def played_back(capture: dict, configure=None):
    """(ctx, engine, server, sidecar), every captured batch published;
    `configure(engine)` changes the engine's config. The engine's HTTP side
    (probed by the sidecar) is a stub that answers."""
    ctx = zmq.Context()
    engine = CapturedEngine(ctx, capture)
    engine.http = await EngineHttp().start()
    engine.config = dataclasses.replace(engine.config, address=engine.http.url)
    if configure is not None:
        engine.config = dataclasses.replace(engine.config, **configure(engine))
    server = RouterServer(
        ServiceConfig(
            listen="127.0.0.1:0",
            metrics_listen="",
            log_format="text",
            log_decisions=False,
            block_size=capture["block_size"],
        )
    )
    await server.start()
    sidecar = VllmSidecar(
        f"127.0.0.1:{server.port}", [engine.config], block_size=capture["block_size"]
    )
    await sidecar.start()
    engine.publish_all()
    return ctx, engine, server, sidecar


async def stop(ctx, engine, server, sidecar) -> None:
    await sidecar.stop()
    await server.stop(grace=0)
    await engine.http.stop()
    engine.close()
    ctx.destroy(linger=0)


async def delivered(sidecar, worker: int, batches: int) -> None:
    """Waits until the sidecar took the worker's first `batches` batches
    and the router acknowledged what it forwarded of them."""
    sink = sidecar.subscriber.sink
    for _ in range(3000):
        if await sink.next_seq(worker) >= batches:
            break
        await asyncio.sleep(0.005)
    else:
        raise AssertionError(f"worker {worker} never got its {batches} batches")
    assert await sidecar.publishers[worker].flush(timeout=15)


def overlap(server, worker: int, probe: dict) -> int:
    found = server.index.find_matches_for_tokens(probe["tokens"], namespace=probe["namespace"])
    return found.tiers.get(worker, (0, 0, 0))[TIERS[probe.get("tier", "device")]]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_router_never_counts_more_than_vllm_reuses(scenario):
    capture = load_capture(VERSION, scenario)

    async def scenario_run():
        parts = await played_back(capture)
        ctx, engine, server, sidecar = parts
        try:
            streams = {s.dp_rank: s for s in engine.config.streams}
            for rank in engine.ranks:
                await delivered(sidecar, streams[rank].worker_id, engine.batches(rank))
            measured = []
            for probe in capture["probes"]:
                worker = streams[probe["dp_rank"]].worker_id
                got = overlap(server, worker, probe)
                want = probe.get("vllm_hit_blocks", probe.get("expected_blocks"))
                measured.append((probe["name"], got, want))
                if probe["expect"] == "equal":
                    assert got == want, (probe["name"], got, want)
                else:
                    assert got <= want, (probe["name"], got, want)
            print(scenario, measured)
        finally:
            await stop(*parts)

    run(scenario_run())


def test_a_batch_for_a_rank_the_entry_does_not_hold_is_skipped():
    """An entry pointed at global rank 2's sockets but configured as rank 0
    (a node whose `data_parallel_start_rank` was left out): rank 2's batches
    are not the entry's worker's."""
    capture = load_capture(VERSION, "dp_start_rank_1")

    def misconfigured(engine):
        return {
            "endpoint": f"tcp://127.0.0.1:{engine.base + 2}",
            "replay_endpoint": f"tcp://127.0.0.1:{engine.replay_base + 2}",
            "data_parallel_start_rank": 0,
            "data_parallel_size": 1,
            "worker_ids": (),
        }

    async def scenario_run():
        parts = await played_back(capture, misconfigured)
        ctx, engine, server, sidecar = parts
        try:
            stats = sidecar.subscriber.stats
            await until(lambda: stats["foreign_rank"] >= 1, "rank 2's batches skipped")
            (worker,) = engine.config.worker_ids
            assert server.index.workers().get(worker, (0, 0))[0] == 0
        finally:
            await stop(*parts)

    run(scenario_run())


def test_ranks_behind_one_address_register_their_global_rank():
    """A node's DP ranks 1-2 share the engine's one address: each worker is
    registered with its global rank, which the router names in requests."""
    capture = load_capture(VERSION, "dp_start_rank_1")

    async def scenario_run():
        parts = await played_back(capture)
        ctx, engine, server, sidecar = parts
        try:
            ranks = {
                s.worker_id: server.workers.data_parallel_rank(s.worker_id)
                for s in engine.config.streams
            }
            assert sorted(ranks.values()) == [1, 2]
            assert all(ranks[s.worker_id] == s.dp_rank for s in engine.config.streams)
        finally:
            await stop(*parts)

    run(scenario_run())


def test_a_salted_request_is_routed_in_its_salt():
    """vLLM's salted blocks, the salted sequence grown in a later step,
    and the same prompt unsalted: a Route naming the model and a cache
    salt counts the blocks vLLM would serve for that salt, and neither a
    salted nor an unsalted request claims the other's."""
    capture = load_capture(VERSION, "cache_salt")

    async def scenario_run():
        parts = await played_back(capture, lambda engine: {"model": "tiny"})
        ctx, engine, server, sidecar = parts
        try:
            (stream,) = engine.config.streams
            await delivered(sidecar, stream.worker_id, engine.batches(0))
            async with AsyncRouterClient(f"127.0.0.1:{server.port}") as client:
                for probe in capture["probes"]:
                    result = await client.route(
                        probe["tokens"], model="tiny", namespace=probe["namespace"], explain=True
                    )
                    await client.cancelled(result.request_id)
                    (candidate,) = result.explanation.decode_candidates
                    assert candidate.overlap_device == probe["vllm_hit_blocks"], probe["name"]
        finally:
            await stop(*parts)

    run(scenario_run())
