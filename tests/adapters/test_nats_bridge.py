"""vLLM engines → ZMQ → bridge → JetStream → two router replicas."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from kvrouter import hash_tokens
from kvrouter.adapters.nats import EngineBridge, JetStreamWorkerPublisher, NatsConfig
from kvrouter.adapters.vllm import register_engines
from kvrouter.cli._until_signal import until_signal
from kvrouter.service.replicas import RouterReplica

from . import vllm_schema as vs
from .conftest import until
from .engine_hashes import EngineHasher, prompt
from .test_vllm_events import run

pytest.importorskip("nats", reason="the adapters extra (nats-py) is not installed")


def test_replicas_route_by_events_the_bridge_relays(farm, nats_url):
    a, (pub_a,) = farm.start("a", "map")
    b, (pub_b,) = farm.start("b", "positional")
    hasher = EngineHasher(as_bytes=False)
    on_a, on_b = prompt(1, 6), prompt(2, 6)

    async def scenario():
        config = NatsConfig(servers=(nats_url,))
        async with (
            EngineBridge(config, [a, b]) as bridge,
            RouterReplica(config, "r1") as r1,
            RouterReplica(config, "r2") as r2,
        ):
            pub_a.publish([vs.stored("map", hasher.hashes(on_a), on_a)])
            lost = pub_b.publish([vs.stored("positional", hasher.hashes(on_b), on_b)], lost=True)
            pub_b.publish([])  # reveals the lost batch, which replay repairs
            for replica in (r1, r2):
                register_engines(replica.router, [a, b])
                for engine, tokens in ((a, on_a), (b, on_b)):
                    await until(
                        lambda r=replica, e=engine, t=tokens: (
                            r.index.find_matches_for_tokens(t).scores == {e.worker_ids[0]: 6}
                        ),
                        f"{engine.name}'s blocks in replica {replica.name}",
                    )
            # The replicas can hold B's blocks (its repaired batch) before the
            # bridge has finished relaying the empty batch after it.
            await until(lambda: bridge.subscriber.stats["batches"] >= 3, "all 3 batches relayed")
            assert lost == 0
            assert r1.router.route("q1", on_a + [1]).decode_worker == a.worker_ids[0]
            assert r2.router.route("q2", on_b + [1]).decode_worker == b.worker_ids[0]

    run(scenario())


def test_a_kvrouter_worker_publishes_to_the_stream(nats_url):
    tokens, other = prompt(1, 4), prompt(2, 2)

    async def scenario():
        config = NatsConfig(servers=(nats_url,))
        async with RouterReplica(config, "r1") as r1:
            for run_of_worker in range(2):
                publisher = JetStreamWorkerPublisher(r1.nc.jetstream(), config, 5)
                await publisher.start()
                # The engine names blocks by the router's own hashes.
                held = tokens if run_of_worker == 0 else other
                await asyncio.to_thread(publisher.stored, None, hash_tokens(held), held)
                await publisher.stop()
                await until(
                    lambda h=held: r1.index.find_matches_for_tokens(h).scores == {5: len(h) // 16},
                    "the worker's blocks",
                )
            # The restarted worker's first batch dropped the earlier run's blocks.
            assert r1.index.find_matches_for_tokens(tokens).scores == {}

    run(scenario())


def test_the_bridge_command_relays_engine_events(farm, nats_url, tmp_path):
    a, (pub_a,) = farm.start("a", "map")
    engines = tmp_path / "engines.json"
    entry = {f.name: getattr(a, f.name) for f in dataclasses.fields(a) if f.init}
    engines.write_text(json.dumps({"engines": [entry]}))
    tokens = prompt(1, 6)
    blocks = EngineHasher(as_bytes=False).hashes(tokens)
    log = tmp_path / "bridge.log"
    with log.open("w") as out:
        bridge = subprocess.Popen(
            [sys.executable, "-m", "kvrouter.cli", "bridge", "--nats", nats_url, str(engines)],
            stderr=out,
        )

    async def relayed():
        async with RouterReplica(NatsConfig(servers=(nats_url,)), "r1") as r1:
            pub_a.publish([vs.stored("map", blocks, tokens)])
            deadline = time.monotonic() + 150
            # The bridge subscribes after its start-up: a later batch reveals
            # the first one to it, and it replays the gap.
            while r1.index.find_matches_for_tokens(tokens).scores != {a.worker_ids[0]: 6}:
                assert bridge.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "gave up waiting for the relayed blocks"
                pub_a.publish([])
                await asyncio.sleep(0.05)

    try:
        asyncio.run(asyncio.wait_for(relayed(), 180))
    finally:
        bridge.kill()
        bridge.wait()


def test_the_bridge_command_stops_its_part_on_sigterm():
    events = []

    class Part:
        async def __aenter__(self):
            events.append("started")
            asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)

        async def __aexit__(self, *exc):
            events.append("stopped")

    run(until_signal(Part()))
    assert events == ["started", "stopped"]
