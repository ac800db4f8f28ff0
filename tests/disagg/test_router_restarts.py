"""`kvrouter worker` processes under a router killed, drained and paused
(longer than its heartbeat TTL) and restarted at the same address: after each
fault the router's index again holds every block each worker has cached."""

from __future__ import annotations

import signal
import time

import grpc
import pytest
from waiting import wait_until

from kvrouter.client import RouterError
from kvrouter.demo.cluster import LocalCluster

from .helpers import generate, prompt, worker_status

# Longer than the router's heartbeat TTL (5 s by default).
PAUSE_S = 7.0


@pytest.fixture(scope="module")
def cluster(tiny_model, tmp_path_factory):
    cluster = LocalCluster(
        tiny_model,
        ["prefill", "decode"],
        # Prompts longer than this are split, so both workers cache blocks.
        router_env={"KVROUTER_POLICY_LOCAL_PREFILL_MAX_TOKENS": "64"},
        worker_args=["--num-kv-blocks", "512"],
        log_dir=tmp_path_factory.mktemp("restart-logs"),
    ).start()
    yield cluster
    cluster.stop()


def index_level(cluster: LocalCluster) -> bool:
    """Every worker routable, the index holding exactly the blocks it caches."""
    try:
        infos = cluster.list_workers()
        cached = {w.worker_id: worker_status(w.address).cached_blocks for w in infos}
    except (RouterError, grpc.RpcError):  # the router, or a worker, not answering yet
        return False
    held = {w.worker_id: w.index_blocks for w in infos if w.routable}
    return len(held) == len(cluster.workers) and held == cached and all(cached.values())


def test_the_index_follows_real_workers_through_router_faults(cluster):
    for seed, fault in enumerate(("kill", "term", "pause", "kill")):
        for turn in range(4):
            generate(cluster.target, prompt(100 * seed + turn, 120), 4)
        wait_until(lambda: index_level(cluster), what=f"the index before the {fault}")
        if fault == "pause":
            cluster.router.send_signal(signal.SIGSTOP)
            time.sleep(PAUSE_S)
            cluster.router.send_signal(signal.SIGCONT)
        else:
            if fault == "kill":
                cluster.router.kill()
            else:
                cluster.router.send_signal(signal.SIGTERM)
            cluster.router.wait(30)
            cluster.restart_router()
        wait_until(lambda: index_level(cluster), what=f"the index after the {fault}")
