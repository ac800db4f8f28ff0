"""Putting stub engines behind a router, and reading the router's book."""

from __future__ import annotations

from serve_process import ServeProcess

from kvrouter.client import RouterClient, WorkerRegistration

from .stub import StubEngine

MODEL = "tiny"


def register(target: str, stub: StubEngine, role: str = "both", **fields) -> WorkerRegistration:
    """Registers `stub` as the sidecar registers an engine, its heartbeats
    carrying the load the test sets on it (`stub.load`); `fields` are
    more of WorkerRegistration's (kv_transfer, bootstrap_port)."""
    registration = WorkerRegistration(
        target,
        role=role,
        capacity_blocks=10_000,
        address=stub.url,
        model=MODEL,
        protocol="openai",
        load=lambda: stub.load,
        **fields,
    )
    registration.start_background()
    return registration


def probe(target: str, tokens=(1, 2, 3)):
    """The decision the router would make now, with every candidate."""
    with RouterClient(target) as client:
        result = client.route(list(tokens), model=MODEL, explain=True)
        client.cancelled(result.request_id)
    return result


def booked(target: str) -> dict[int, int]:
    """Requests the router has booked on each decode candidate."""
    return {c.worker_id: c.active_requests for c in probe(target).explanation.decode_candidates}


def split_router() -> ServeProcess:
    """A router that splits every prompt of more than a block, waits 3 s
    for a prefill engine, and tries a failed one again at once (so that
    each test's failures are its own)."""
    return ServeProcess(
        "--proxy",
        "prefill_timeout_s=3",
        "--proxy",
        "failure_cooldown_s=0.001",
        env={"KVROUTER_POLICY_LOCAL_PREFILL_MAX_TOKENS": "16"},
    )
