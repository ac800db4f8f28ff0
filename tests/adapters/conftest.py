"""Fixtures for the adapter tests: vLLM-style publishers on free loopback
ports, and a wait that fails with a message instead of hanging."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

zmq = pytest.importorskip("zmq", reason="the adapters extra (pyzmq) is not installed")
pytest.importorskip("msgspec", reason="the adapters extra (msgspec) is not installed")

from kvrouter.adapters.vllm import EngineConfig  # noqa: E402

from .vllm_publisher import VllmStylePublisher, bind_consecutive  # noqa: E402


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.005)


class EngineFarm:
    """vLLM-style engines on free loopback ports; `farm.start(name, encoding,
    dp=1, ...)` returns (config, [publisher per DP rank])."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.publishers: list[VllmStylePublisher] = []

    def start(
        self,
        name: str,
        encoding: str,
        dp: int = 1,
        buffer_steps: int = 10_000,
        replay: bool = True,
        **config,
    ) -> tuple[EngineConfig, list[VllmStylePublisher]]:
        pubs, pub_port = bind_consecutive(self.ctx, zmq.PUB, dp)
        replays, replay_port = bind_consecutive(self.ctx, zmq.ROUTER, dp)
        publishers = [
            VllmStylePublisher(
                pub, router, encoding=encoding, buffer_steps=buffer_steps, dp_rank=rank
            )
            for rank, (pub, router) in enumerate(zip(pubs, replays, strict=True))
        ]
        self.publishers.extend(publishers)
        engine = EngineConfig(
            name=name,
            endpoint=f"tcp://127.0.0.1:{pub_port}",
            replay_endpoint=f"tcp://127.0.0.1:{replay_port}" if replay else None,
            data_parallel_size=dp,
            topic="kv",
            **config,
        )
        return engine, publishers

    def restart(self, publisher: VllmStylePublisher) -> VllmStylePublisher:
        """The same engine, restarted: same endpoints, batch numbers from 0."""
        endpoints = (publisher.pub.last_endpoint, publisher.replay.last_endpoint)
        publisher.close()
        pub, router = self.ctx.socket(zmq.PUB), self.ctx.socket(zmq.ROUTER)
        for sock, endpoint in ((pub, endpoints[0]), (router, endpoints[1])):
            _bind_when_free(sock, endpoint)
        fresh = VllmStylePublisher(
            pub, router, encoding=publisher.encoding, dp_rank=publisher.dp_rank
        )
        self.publishers.append(fresh)
        return fresh

    def close(self) -> None:
        for publisher in self.publishers:
            publisher.close()
        self.ctx.destroy(linger=0)


def _bind_when_free(sock: zmq.Socket, endpoint: str) -> None:
    """Binds where a just-closed socket listened: ZMQ releases the port in
    the background."""
    deadline = time.monotonic() + 15
    while True:
        try:
            sock.bind(endpoint)
            return
        except zmq.ZMQError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@pytest.fixture
def farm():
    farm = EngineFarm()
    yield farm
    farm.close()


@pytest.fixture
def nats_url(tmp_path):
    """The URL of a fresh nats-server with JetStream, stopped after the test."""
    pytest.importorskip("nats", reason="the adapters extra (nats-py) is not installed")
    from .nats_server import NatsServer

    server = NatsServer(tmp_path / "jetstream")
    yield server.url
    server.stop()
