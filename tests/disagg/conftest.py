"""One deployment per test module, started for real on 127.0.0.1: a router
and 2 prefill + 2 decode workers, each its own process, running a tiny
random-weight model. After every test no worker may hold a request, a
lease or a pinned block."""

from __future__ import annotations

import pytest
from greedy_reference import greedy_reference, greedy_scored
from waiting import wait_until

from kvrouter.demo.cluster import LocalCluster
from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint

from .helpers import all_idle

ROLES = ["prefill", "prefill", "decode", "decode"]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"), "llama", seed=11)


@pytest.fixture(scope="session")
def reference(tiny_model):
    return greedy_reference(tiny_model)


@pytest.fixture(scope="session")
def scored(tiny_model):
    return greedy_scored(tiny_model)


def start_cluster(
    model,
    tmp_path_factory,
    router_env: dict,
    worker_args: list[str],
    router_args=(),
    *,
    roles=ROLES,
    models=None,
):
    cluster = LocalCluster(
        model,
        roles,
        router_env={
            "KVROUTER_POLICY_LOCAL_PREFILL_MAX_TOKENS": "64",
            # The tests read the index through Route (helpers.overlap), which
            # would otherwise record each probe as a prediction.
            "KVROUTER_POLICY_APPROXIMATE_TTL_S": "0",
            **router_env,
        },
        router_args=list(router_args),
        worker_args=["--num-kv-blocks", "512", *worker_args],
        served_models=models,
        log_dir=tmp_path_factory.mktemp("cluster-logs"),
    )
    return cluster.start()


@pytest.fixture
def settled(cluster):
    """Restarts workers a test killed, and checks that nothing stays pinned."""
    yield cluster
    for worker_id, process in cluster.workers.items():
        if process.poll() is not None:
            cluster.start_worker(worker_id)
    cluster.wait_for_workers()
    wait_until(lambda: all_idle(cluster), what="every worker to be idle")
