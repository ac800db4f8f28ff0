"""Routers on 127.0.0.1 with short heartbeat TTLs, and worker processes
that can be killed for real."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kvrouter.client import RouterClient
from kvrouter.service import RouterServer, ServiceConfig

WORKER_SCRIPT = Path(__file__).with_name("worker_process.py")


def wait_until(predicate, timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class LocalRouter:
    def __init__(self, **overrides) -> None:
        defaults = dict(listen="127.0.0.1:0", metrics_listen="", log_decisions=False)
        config = dataclasses.replace(ServiceConfig(), **{**defaults, **overrides})
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server = RouterServer(config)
        self.call(self.server.start())
        self.target = f"127.0.0.1:{self.server.port}"
        self.client = RouterClient(self.target, timeout=5)

    def call(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def on_loop(self, fn, *args):
        async def wrapper():
            return fn(*args)

        return self.call(wrapper())

    def index_blocks(self) -> dict[int, int]:
        """Blocks in the index per worker."""
        return {w: blocks for w, (blocks, _) in self.on_loop(self.server.index.workers).items()}

    def stop(self) -> None:
        self.client.close()
        self.call(self.server.stop(grace=0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture
def start_router():
    started: list[LocalRouter] = []

    def start(**overrides) -> LocalRouter:
        router = LocalRouter(**overrides)
        started.append(router)
        return router

    yield start
    for router in started:
        router.stop()


@pytest.fixture
def spawn_worker():
    """Starts worker_process.py and waits for its "ready"; kills it after the test."""
    processes: list[subprocess.Popen] = []

    def spawn(target: str, worker_id: int, seed: int, blocks: int) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, str(WORKER_SCRIPT), target, str(worker_id), str(seed), str(blocks)],
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
