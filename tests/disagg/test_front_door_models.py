"""Two models behind one front door, each with a worker of its own: the
`model` of a request picks its pool, and no request crosses to the other."""

from __future__ import annotations

import json
import urllib.request

import pytest
from waiting import wait_until

from kvrouter.demo.cluster import free_port

from .conftest import start_cluster
from .helpers import all_idle, worker_status

MODELS = ["llama", "qwen"]


@pytest.fixture(scope="module")
def two_models(tiny_model, tmp_path_factory):
    port = free_port()
    served = ",".join(f"{name}={tiny_model}" for name in MODELS)
    cluster = start_cluster(
        tiny_model,
        tmp_path_factory,
        {},
        [],
        ["--http-listen", f"127.0.0.1:{port}", "--served-models", served],
        roles=["both", "both"],
        models=MODELS,
    )
    yield cluster, f"http://127.0.0.1:{port}"
    cluster.stop()


def complete(base: str, model: str, prompt: str) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0}
    request = urllib.request.Request(
        base + "/v1/completions", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.load(r)


def cached_blocks(cluster) -> dict[str, int]:
    """Blocks each model's worker caches, by model."""
    return {
        MODELS[info.worker_id - 1]: worker_status(info.address).cached_blocks
        for info in cluster.list_workers()
    }


def test_each_model_is_served_by_its_own_workers(two_models):
    cluster, base = two_models
    with urllib.request.urlopen(base + "/v1/models", timeout=10) as r:
        assert sorted(m["id"] for m in json.load(r)["data"]) == MODELS
    for i in range(8):
        assert complete(base, "llama", f"llama prompt number {i} " * 8)["model"] == "llama"
    assert cached_blocks(cluster)["llama"] > 0
    assert cached_blocks(cluster)["qwen"] == 0
    for i in range(8):
        complete(base, "qwen", f"qwen prompt number {i} " * 8)
    assert cached_blocks(cluster)["qwen"] > 0
    wait_until(lambda: all_idle(cluster), what="every worker to be idle")
