"""Routers with authentication and TLS, started for real on 127.0.0.1."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

from kvrouter.service import RouterServer, ServiceConfig

pytest.importorskip("cryptography", reason="the TLS tests generate certificates with it")

from .certs import CertificateAuthority  # noqa: E402

TOKENS = {
    "client": "client-token",
    "admin": "admin-token",
    "worker:1": "worker-1-token",
    "worker:2": "worker-2-token",
}


class SecuredRouter:
    def __init__(self, config: ServiceConfig) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server = RouterServer(config)
        self.call(self.server.start())
        self.target = f"127.0.0.1:{self.server.port}"

    def call(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.call(self.server.stop(grace=0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "tokens"
    lines = [f"{role} {token}" for role, token in TOKENS.items()]
    path.write_text("# role token\n" + "\n".join(lines) + "\n")
    return str(path)


@pytest.fixture(scope="session")
def ca():
    return CertificateAuthority()


@pytest.fixture
def start_router():
    started: list[SecuredRouter] = []

    def start(**overrides) -> SecuredRouter:
        defaults = dict(listen="127.0.0.1:0", metrics_listen="", log_decisions=False)
        router = SecuredRouter(dataclasses.replace(ServiceConfig(), **{**defaults, **overrides}))
        started.append(router)
        return router

    yield start
    for router in started:
        router.stop()
