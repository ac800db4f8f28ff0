"""Routers started for real on 127.0.0.1 (free ports), each on an event loop
of its own thread, and stopped after the test."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

from kvrouter.client import KvEventPublisher, RouterClient, WorkerRegistration
from kvrouter.service import RouterServer, ServiceConfig


class RunningRouter:
    def __init__(self, config: ServiceConfig) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server = RouterServer(config)
        self.call(self.server.start())
        self.target = f"127.0.0.1:{self.server.port}"
        self._cleanups: list = []

    def call(self, coro, timeout: float = 30.0):
        """Runs a coroutine on the router's loop (where its state lives)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def on_loop(self, fn, *args):
        async def wrapper():
            return fn(*args)

        return self.call(wrapper())

    def client(self) -> RouterClient:
        client = RouterClient(self.target)
        self._cleanups.append(client.close)
        return client

    def worker(self, worker_id: int, role: str = "both", **kwargs) -> WorkerRegistration:
        registration = WorkerRegistration(
            self.target,
            role=role,
            capacity_blocks=100_000,
            worker_id=worker_id,
            address=f"w{worker_id}:1",
            **kwargs,
        )
        registration.start_background()
        self._cleanups.append(lambda: registration.stop_background(deregister=False))
        return registration

    def publisher(self, worker_id: int, **kwargs) -> KvEventPublisher:
        publisher = KvEventPublisher(self.target, worker_id, backoff_max_s=0.2, **kwargs)
        publisher.start()
        self._cleanups.append(lambda: publisher.close(timeout=1.0))
        return publisher

    def stop(self) -> None:
        for cleanup in reversed(self._cleanups):
            cleanup()
        self.call(self.server.stop(grace=0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def local_config(**overrides) -> ServiceConfig:
    defaults = dict(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0", log_decisions=False)
    return dataclasses.replace(ServiceConfig(), **{**defaults, **overrides})


@pytest.fixture
def start_router():
    started: list[RunningRouter] = []

    def start(**overrides) -> RunningRouter:
        router = RunningRouter(local_config(**overrides))
        started.append(router)
        return router

    yield start
    for router in started:
        router.stop()


@pytest.fixture
def router(start_router) -> RunningRouter:
    return start_router()
