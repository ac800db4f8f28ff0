"""A real `kvrouter serve` killed, drained and paused under its workers.

Back on the same port, again and again, every worker's publisher reconnects
and the router's index comes back to what the workers hold. Paused for longer
than its heartbeat TTL, the router does not expire workers for the time it
could not see: they and their index entries stay."""

from __future__ import annotations

import signal
import time

from serve_process import ServeProcess
from waiting import wait_until

from kvrouter.client import RouterClient
from kvrouter.demo.cluster import free_port

from .worker_process import prompt

BLOCKS = {1: 20, 2: 35}
# Longer than the router's heartbeat TTL (5 s by default).
PAUSE_S = 7.0


def index_matches(target: str) -> bool:
    """Every worker registered, routable, with all its blocks in the index."""
    with RouterClient(target, timeout=2) as client:
        try:
            infos = client.list_workers()
        except Exception:
            return False
    held = {w.worker_id: w.index_blocks for w in infos if w.routable}
    return held == BLOCKS


def pause(router: ServeProcess) -> None:
    router.proc.send_signal(signal.SIGSTOP)
    time.sleep(PAUSE_S)
    router.proc.send_signal(signal.SIGCONT)


def test_publishers_survive_router_kills_drains_and_pauses(spawn_worker):
    target = f"127.0.0.1:{free_port()}"
    router = ServeProcess(listen=target)
    try:
        for worker_id, blocks in BLOCKS.items():
            spawn_worker(target, worker_id, seed=worker_id, blocks=blocks, churn=True)
        wait_until(lambda: index_matches(target), what="the first index")
        for fault in ("kill", "term", "pause", "kill", "pause", "term"):
            if fault == "pause":
                pause(router)
            else:
                if fault == "kill":
                    router.kill()
                else:
                    assert router.terminate() == 0
                router = ServeProcess(listen=target)
            wait_until(lambda: index_matches(target), what=f"the index after a router {fault}")
    finally:
        router.kill()


def test_a_paused_router_keeps_its_workers_and_their_entries(spawn_worker):
    router = ServeProcess()
    try:
        for worker_id, blocks in BLOCKS.items():
            spawn_worker(router.target, worker_id, seed=worker_id, blocks=blocks)
        wait_until(lambda: index_matches(router.target), what="the first index")
        pause(router)
        wait_until(lambda: index_matches(router.target), what="the index after the pause")
        with RouterClient(router.target) as client:
            routed = client.route(prompt(1, BLOCKS[1]), request_id="after-the-pause")
        # Every line the router logged before this decision has been read.
        assert router.wait_for("routed")["request_id"] == "after-the-pause"
        assert routed.decode_worker == 1
        assert router.logged("worker removed") == []
        assert router.logged("router stalled; expiry held")
    finally:
        router.kill()
