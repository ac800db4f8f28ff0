"""End to end: a real `kvrouter serve`, a real `kvrouter worker` in its
engine-compatible mode (not registered with the router itself) and a real
`kvrouter sidecar` that subscribes to its KV events, probes its /health and
/metrics and registers it with the router under its HTTP address."""

from __future__ import annotations

import subprocess
import sys

import openai
import pytest
from serve_process import ServeProcess
from waiting import wait_until

from kvrouter.client import RouterClient

from .conftest import BLOCK_SIZE, MODEL, NUM_KV_BLOCKS, start_engine_worker

PROMPT = list(range(60, 60 + 3 * BLOCK_SIZE + 1))


@pytest.fixture
def deployment(tiny_model, tmp_path):
    router = ServeProcess(
        "--block-size",
        str(BLOCK_SIZE),
        "--heartbeat-interval-s",
        "0.25",
        "--heartbeat-ttl-s",
        "2",
    )
    worker = start_engine_worker(tiny_model)
    engines = tmp_path / "engines.toml"
    engines.write_text(
        f"""[[engines]]
name = "engine-worker"
endpoint = "{worker.kv_events}"
replay_endpoint = "{worker.kv_replay}"
address = "{worker.url}"
model = "{MODEL}"
capacity_blocks = {NUM_KV_BLOCKS}
probe_interval_s = 0.2
kv_transfer = "vllm"
"""
    )
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "kvrouter.cli", "sidecar", str(engines), "--router", router.target],
        stderr=(tmp_path / "sidecar.log").open("w"),
    )
    yield router, worker
    sidecar.kill()
    sidecar.wait()
    worker.kill()
    router.kill()


def listed(router) -> dict:
    with RouterClient(router.target) as client:
        return {w.address: w for w in client.list_workers()}


def test_the_router_indexes_and_weighs_the_worker_through_the_sidecar(deployment, reference):
    router, worker = deployment
    wait_until(lambda: worker.url in listed(router), what="the sidecar to register the worker")
    assert listed(router)[worker.url].model == MODEL
    assert listed(router)[worker.url].kv_transfer == "vllm"

    with openai.OpenAI(base_url=f"{worker.url}/v1", api_key="unused") as client:
        stream = client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=5,
            temperature=0,
            stream=True,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
        tokens = [t for chunk in stream for t in chunk.choices[0].model_extra["token_ids"]]
        assert tokens == reference(PROMPT, 5)
        wait_until(
            lambda: listed(router)[worker.url].index_blocks >= 3,
            what="the router's index to hold the prompt's blocks",
        )

        # A request in flight shows in the load the sidecar probes.
        long = client.completions.create(
            model=MODEL,
            prompt=[t + 1 for t in PROMPT],
            max_tokens=1500,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        next(iter(long))
        wait_until(
            lambda: listed(router)[worker.url].active_requests == 1,
            what="the probed load to reach the router",
        )
        long.close()
        wait_until(
            lambda: listed(router)[worker.url].active_requests == 0,
            what="the aborted request to leave the load",
        )

    worker.kill()
    wait_until(lambda: worker.url not in listed(router), what="the dead worker to leave routing")
