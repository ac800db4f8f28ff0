"""Routers on 127.0.0.1 with short heartbeat TTLs, and worker processes
that can be killed for real."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
from threaded_router import ThreadedRouter, router_config, started_routers

from kvrouter.client import RouterClient

WORKER_SCRIPT = Path(__file__).with_name("worker_process.py")


class LocalRouter(ThreadedRouter):
    def __init__(self, **overrides) -> None:
        super().__init__(router_config(**overrides))
        self.client = RouterClient(self.target, timeout=5)

    def index_blocks(self) -> dict[int, int]:
        """Blocks in the index per worker."""
        return {w: blocks for w, (blocks, _) in self.on_loop(self.server.index.workers).items()}

    def stop(self) -> None:
        self.client.close()
        super().stop()


@pytest.fixture
def start_router():
    yield from started_routers(LocalRouter)


@pytest.fixture
def spawn_worker():
    """Starts worker_process.py and waits for its "ready"; kills it after the test."""
    processes: list[subprocess.Popen] = []

    def spawn(
        target: str, worker_id: int, seed: int, blocks: int, churn: bool = False
    ) -> subprocess.Popen:
        args = [target, str(worker_id), str(seed), str(blocks), *(["churn"] if churn else [])]
        process = subprocess.Popen(
            [sys.executable, str(WORKER_SCRIPT), *args],
            stdout=subprocess.PIPE,
            text=True,
        )
        processes.append(process)
        ready = threading.Event()
        threading.Thread(
            target=lambda: process.stdout.readline() == "ready\n" and ready.set(), daemon=True
        ).start()
        if not ready.wait(30):
            process.kill()
            raise AssertionError(f"worker {worker_id} did not become ready")
        return process

    yield spawn
    for process in processes:
        process.kill()
        process.wait(10)
