"""Putting stub engines behind a router, and reading the router's book."""

from __future__ import annotations

import asyncio

from serve_process import ServeProcess
from waiting import wait_until

from kvrouter.client import RouterClient, WorkerRegistration
from kvrouter.client.generate import GenerateClient

from .stub import StubEngine

MODEL = "tiny"


def register(
    target: str, stub: StubEngine, role: str = "both", model: str = MODEL, **fields
) -> WorkerRegistration:
    """Registers `stub` as the sidecar registers an engine, its heartbeats
    carrying the load the test sets on it (`stub.load`); `fields` are
    more of WorkerRegistration's (kv_transfer, bootstrap_port)."""
    registration = WorkerRegistration(
        target,
        role=role,
        capacity_blocks=10_000,
        address=stub.url,
        model=model,
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


def split_engines(target: str, kv_transfer: str, bootstrap_port: int = 0):
    """A prefill and a decode stub registered as a `kv_transfer` pair, for
    a fixture to yield from: (prefill, decode, prefill_id, decode_id). With
    SGLang's `bootstrap_port`, the decode stub waits for the prefill's room."""
    prefill = StubEngine(list(range(100, 120)), bootstrap_port=bootstrap_port).start()
    decode = StubEngine(list(range(40, 60)), prefill=prefill if bootstrap_port else None).start()
    bootstrap = {"bootstrap_port": bootstrap_port} if bootstrap_port else {}
    registrations = [
        register(target, prefill, role="prefill", kv_transfer=kv_transfer, **bootstrap),
        register(target, decode, role="decode", kv_transfer=kv_transfer),
    ]
    try:
        yield prefill, decode, registrations[0].worker_id, registrations[1].worker_id
    finally:
        for registration in registrations:
            registration.stop_background()
        prefill.stop()
        decode.stop()


def split_pair(target: str, engines: tuple, prompt: list[int]):
    """`engines` reset, once the router splits `prompt` between them, for a
    fixture to yield from; after the test, every booking is closed."""
    prefill, decode, prefill_id, _ = engines
    prefill.reset()
    decode.reset()
    wait_until(lambda: probe(target, prompt).prefill_worker == prefill_id, what="a split decision")
    yield engines
    wait_until(lambda: not any(booked(target).values()), what="every booking to be closed")
    wait_until(lambda: not prefill_booked(target, prompt), what="the prefill booking to be closed")


def prefill_booked(target: str, prompt: list[int]) -> float:
    """The queue the router predicts on the prefill engine: its booked prefills."""
    return sum(c.queue_ms for c in probe(target, prompt).explanation.prefill_candidates)


def generate(target: str, prompt: list[int], max_tokens: int = 5):
    """A proxied Generate of `prompt` for the stub engines' model."""

    async def run():
        async with GenerateClient(target, model=MODEL, timeout=60) as client:
            return await client.generate(prompt, max_tokens=max_tokens)

    return asyncio.run(run())
