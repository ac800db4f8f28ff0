"""The sidecar probes each engine's `/health` and `/metrics`: an engine that
dies or hangs leaves routing within the router's heartbeat TTL, one that
comes back returns, the heartbeats carry the load the engine reports, and
the workers register with the KV capacity it states. A real router service
and real HTTP servers on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import pytest

from kvrouter.adapters.vllm.config import DEFAULT_CAPACITY_BLOCKS
from kvrouter.adapters.vllm.probe import EngineProbe
from kvrouter.adapters.vllm.sidecar import VllmSidecar
from kvrouter.client.types import WorkerLoad
from kvrouter.service import RouterServer, ServiceConfig

from .conftest import until
from .engine_http import EngineHttp
from .test_vllm_events import run

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TTL_S = 2.0
PROBE = {"probe_interval_s": 0.2, "probe_timeout_s": 0.5}
VLLM_METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:request_prompt_tokens histogram
vllm:request_prompt_tokens_sum{engine="0",model_name="m"} 4000.0
vllm:request_prompt_tokens_count{engine="0",model_name="m"} 10.0
"""


async def router() -> RouterServer:
    server = RouterServer(
        ServiceConfig(
            listen="127.0.0.1:0",
            metrics_listen="",
            log_format="text",
            log_decisions=False,
            heartbeat_interval_s=0.25,
            heartbeat_ttl_s=TTL_S,
        )
    )
    await server.start()
    return server


@contextlib.asynccontextmanager
async def probed(farm, page: str, **entry):
    """An engine serving `page` as its /metrics, its engines.toml entry
    (`entry` added), and a router it joins through a sidecar that probes it:
    (the engine's HTTP server, the entry, the router)."""
    http = await EngineHttp(page).start()
    entry = {"capacity_blocks": 1000, **PROBE, **entry}
    engine, _ = farm.start("a", "map", address=http.url, **entry)
    server = await router()
    try:
        async with VllmSidecar(f"127.0.0.1:{server.port}", [engine]):
            yield http, engine, server
    finally:
        await http.stop()
        await server.stop(grace=0)


@pytest.mark.parametrize("failure", ["stopped", "down", "hung"])
def test_an_engine_that_fails_leaves_routing_within_the_ttl_and_comes_back(farm, failure):
    async def scenario():
        async with probed(farm, VLLM_METRICS) as (http, engine, server):
            (worker,) = engine.worker_ids
            await until(lambda: worker in server.workers, "the engine to register")
            failed_at = time.monotonic()
            if failure == "stopped":
                await http.stop()
            else:
                http.state = failure
            await until(lambda: worker not in server.workers, "the failed engine to leave")
            # The last good probe came before the failure, its heartbeat
            # at most one probe later.
            assert time.monotonic() - failed_at <= TTL_S + 1.0 + PROBE["probe_timeout_s"]
            if failure == "stopped":
                await http.start(http.port)
            http.state = "up"
            await until(lambda: worker in server.workers, "the engine to come back")

    run(scenario())


def test_heartbeats_carry_the_engines_reported_load(farm):
    async def scenario():
        async with probed(farm, VLLM_METRICS) as (_, engine, server):
            (worker,) = engine.worker_ids
            # 2 waiting × a 400-token mean prompt; 25% of 1,000 blocks; 3 + 2.
            await until(
                lambda: worker in server.workers and server.policy.load(worker) == (800, 250, 5),
                "the engine's load to reach the router",
            )

    run(scenario())


def test_each_dp_rank_of_a_node_gets_its_global_ranks_load(farm):
    """vLLM labels each rank's series with its global DP rank (`engine`): on
    a node holding ranks 1-2, vLLM 0.33's own page relabelled so, each
    rank's worker heartbeats the load of its own label."""
    page = FIXTURES / "vllm-0.33.0-metrics.txt"
    recorded = json.loads(Path(f"{page}.json").read_text())
    text = page.read_text().replace('engine="1"', 'engine="2"').replace('engine="0"', 'engine="1"')

    def load(state: dict) -> tuple[int, int, int]:
        waiting = state["waiting"] + state["deferred"]
        mean_prompt = sum(state["prompts"]) / len(state["prompts"])
        return (
            round(waiting * mean_prompt),
            round(state["kv_cache_usage"] * 1000),
            state["running"] + waiting,
        )

    async def scenario():
        async with probed(farm, text, dp=2, data_parallel_start_rank=1) as (_, engine, server):
            workers = {s.dp_rank: s.worker_id for s in engine.streams}
            assert set(workers) == {1, 2}
            await until(
                lambda: all(
                    worker in server.workers
                    and server.policy.load(worker) == load(recorded[str(rank - 1)])
                    for rank, worker in workers.items()
                ),
                "each rank's load to reach its worker",
            )

    run(scenario())


def test_a_rank_the_page_does_not_name_is_logged_and_reports_no_load(farm, caplog):
    """An entry for rank 0 (a node's start rank left out) against a page
    labelled rank 1: rank 0 has no series of its own."""
    page = VLLM_METRICS.replace('engine="0"', 'engine="1"')

    async def scenario():
        async with probed(farm, page) as (_, engine, server):
            (worker,) = engine.worker_ids
            await until(lambda: worker in server.workers, "the engine to register")
            await until(
                lambda: "names other DP ranks" in caplog.text, "the missing rank to be logged"
            )
            assert server.policy.load(worker) == (0, 0, 0)

    run(scenario())


def cache_config(tokens: int | str, num_gpu_blocks: int | str = 1) -> str:
    """vLLM 0.33's info gauge for its cache config, as its logger writes it
    (the labels that matter here)."""
    return (
        "# TYPE vllm:cache_config_info gauge\n"
        f'vllm:cache_config_info{{block_size="16",engine="0",kv_cache_size_tokens="{tokens}",'
        f'num_gpu_blocks="{num_gpu_blocks}",enable_prefix_caching="True"}} 1.0\n'
    )


def test_workers_register_with_the_capacity_the_engine_states_and_follow_a_restart(farm):
    """An entry without `capacity_blocks`: the rank registers with the
    tokens the engine's page states, in the router's 16-token blocks, its
    load counts usage in them, and when the engine comes back with another
    cache size the rank registers again with it."""
    page = VLLM_METRICS + cache_config(32_000)

    async def scenario():
        async with probed(farm, page, capacity_blocks=None) as (http, engine, server):
            (worker,) = engine.worker_ids
            await until(lambda: worker in server.workers, "the engine to register")
            assert server.workers.get(worker).capacity_blocks == 2000
            await until(
                lambda: server.policy.load(worker) == (800, 500, 5),
                "the load, counted in the stated capacity",
            )
            http.metrics = VLLM_METRICS + cache_config(48_000)
            await until(
                lambda: server.workers.get(worker).capacity_blocks == 3000,
                "the new capacity to reach the router",
            )
            await until(lambda: server.policy.load(worker) == (800, 750, 5), "the load in it")

    run(scenario())


@pytest.mark.parametrize("stated", ["none", "not yet sized"])
def test_an_engine_stating_no_capacity_gets_the_default_and_a_warning(farm, caplog, stated):
    unsized = cache_config("None", num_gpu_blocks="None")
    page = VLLM_METRICS + (unsized if stated == "not yet sized" else "")

    async def scenario():
        async with probed(farm, page, capacity_blocks=None) as (_, engine, server):
            (worker,) = engine.worker_ids
            await until(lambda: worker in server.workers, "the engine to register")
            assert server.workers.get(worker).capacity_blocks == DEFAULT_CAPACITY_BLOCKS
            assert "states no KV capacity" in caplog.text

    run(scenario())


def test_the_entrys_capacity_wins_over_the_engines(farm):
    async def scenario():
        page = VLLM_METRICS + cache_config(80_000)
        async with probed(farm, page, capacity_blocks=1000) as (_, engine, server):
            (worker,) = engine.worker_ids
            await until(lambda: worker in server.workers, "the engine to register")
            await until(lambda: server.policy.load(worker) == (800, 250, 5), "the load")
            assert server.workers.get(worker).capacity_blocks == 1000

    run(scenario())


def test_each_dp_rank_registers_its_own_engines_capacity_not_the_front_ends_sum(farm):
    """vLLM 0.33's own page for two DP engines behind one front end, which
    sums their blocks in `num_gpu_blocks`: each rank registers one
    engine's `kv_cache_size_tokens`."""
    page = FIXTURES / "vllm-0.33.0-metrics.txt"
    recorded = json.loads(Path(f"{page}.json").read_text())

    async def scenario():
        async with probed(farm, page.read_text(), dp=2, capacity_blocks=None) as (
            _,
            engine,
            server,
        ):
            workers = {s.dp_rank: s.worker_id for s in engine.streams}
            await until(lambda: all(w in server.workers for w in workers.values()), "the ranks")
            for rank, worker in workers.items():
                expected = recorded[str(rank)]["kv_cache_size_tokens"] // 16
                assert server.workers.get(worker).capacity_blocks == expected

    run(scenario())


def test_a_sidecar_started_before_its_engine_takes_its_capacity_once_it_answers(farm):
    """Until the engine answers, its ranks register with the default; the
    first page it serves brings its own capacity to the router."""

    async def scenario():
        page = VLLM_METRICS + cache_config(32_000)
        http = await EngineHttp(page).start()
        http.state = "down"
        entry = {**PROBE, "capacity_blocks": None}
        engine, _ = farm.start("a", "map", address=http.url, **entry)
        server = await router()
        try:
            async with VllmSidecar(f"127.0.0.1:{server.port}", [engine]):
                (worker,) = engine.worker_ids
                await until(lambda: worker in server.workers, "the rank to register")
                assert server.workers.get(worker).capacity_blocks == DEFAULT_CAPACITY_BLOCKS
                http.state = "up"
                await until(
                    lambda: (
                        worker in server.workers
                        and server.workers.get(worker).capacity_blocks == 2000
                    ),
                    "the engine's capacity to reach the router",
                )
        finally:
            await http.stop()
            await server.stop(grace=0)

    run(scenario())


def test_a_stated_capacity_is_kept_through_a_page_without_it_and_tiny_figures_are_not_one(
    caplog,
):
    """One probe at a time, by hand: the last capacity the engine stated
    stands until it states another; a figure under one block states
    nothing; a rank the page does not name is logged as that, not as a
    rank without a capacity."""

    async def scenario():
        http = await EngineHttp(VLLM_METRICS + cache_config(32_000)).start()
        probe = EngineProbe("a", http.url, None, block_size=16, interval_s=3600, timeout_s=1)
        try:
            await probe.start()
            assert probe.capacity_for(0) == 2000
            http.metrics = VLLM_METRICS
            await probe.probe()
            assert probe.capacity_for(0) == 2000
            http.metrics = VLLM_METRICS + cache_config(48_000)
            await probe.probe()
            assert probe.capacity_for(0) == 3000
            other = EngineProbe("b", http.url, None, block_size=16, interval_s=3600, timeout_s=1)
            http.metrics = VLLM_METRICS + cache_config(8)
            await other.start()
            assert other.capacity_for(0) == DEFAULT_CAPACITY_BLOCKS
            assert "states no KV capacity" in caplog.text
            await other.stop()
            caplog.clear()
            http.metrics = (VLLM_METRICS + cache_config(32_000)).replace('engine="0"', 'engine="1"')
            missing = EngineProbe("c", http.url, None, block_size=16, interval_s=3600, timeout_s=1)
            await missing.start()
            assert missing.capacity_for(0) == DEFAULT_CAPACITY_BLOCKS
            assert missing.load_for(0, within_s=60) == WorkerLoad()
            assert "names other DP ranks" in caplog.text
            assert "states no KV capacity" not in caplog.text
            await missing.stop()
        finally:
            await probe.stop()
            await http.stop()

    run(scenario())
