"""Routers and workers with authentication and TLS, started for real on
127.0.0.1."""

from __future__ import annotations

import pytest
from threaded_router import ThreadedRouter, router_config, started_routers
from threaded_worker import started_workers

from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint

pytest.importorskip("cryptography", reason="the TLS tests generate certificates with it")

from .certs import CertificateAuthority  # noqa: E402

TOKENS = {
    "client": "client-token",
    "admin": "admin-token",
    "router": "router-token",
    "worker:1": "worker-1-token",
    "worker:2": "worker-2-token",
}


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
    yield from started_routers(lambda **overrides: ThreadedRouter(router_config(**overrides)))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"), "llama", seed=3)


@pytest.fixture
def start_worker(tiny_model):
    yield from started_workers(str(tiny_model), num_kv_blocks=128, torch_threads=0)
