"""Routers started for real on 127.0.0.1 (free ports), each on an event loop
of its own thread, and stopped after the test."""

from __future__ import annotations

import pytest
from threaded_router import ThreadedRouter, router_config, started_routers

from kvrouter.client import KvEventPublisher, RouterClient, WorkerRegistration
from kvrouter.service import ServiceConfig


class RunningRouter(ThreadedRouter):
    """A router whose clients, workers and publishers close before it stops."""

    def __init__(self, config: ServiceConfig) -> None:
        super().__init__(config)
        self._cleanups: list = []

    def client(self) -> RouterClient:
        client = RouterClient(self.target)
        self._cleanups.append(client.close)
        return client

    def worker(
        self,
        worker_id: int,
        role: str = "both",
        address: str = "",
        capacity_blocks: int = 100_000,
        **kwargs,
    ) -> WorkerRegistration:
        registration = WorkerRegistration(
            self.target,
            role=role,
            capacity_blocks=capacity_blocks,
            worker_id=worker_id,
            address=address or f"w{worker_id}:1",
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
        super().stop()


def local_config(**overrides) -> ServiceConfig:
    return router_config(**{"metrics_listen": "127.0.0.1:0", **overrides})


@pytest.fixture
def start_router():
    yield from started_routers(lambda **overrides: RunningRouter(local_config(**overrides)))


@pytest.fixture
def router(start_router) -> RunningRouter:
    return start_router()
