"""`kvrouter serve --nats`: two router replicas behind the gRPC service on a
real nats-server. Events published to the stream reach both, a Route through
either picks the worker that holds the prompt's prefix, and concurrent
routing through both spreads the load."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from array import array
from collections import Counter

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc
from kvrouter.service import ServiceConfig

from .conftest import until

nats = pytest.importorskip("nats", reason="the adapters extra (nats-py) is not installed")

from kvrouter.adapters.nats import JetStreamWorkerPublisher, NatsConfig  # noqa: E402
from kvrouter.cli import main as kvrouter_main  # noqa: E402
from kvrouter.service import snapshot_file  # noqa: E402
from kvrouter.service.replicas import ReplicaServer  # noqa: E402

BLOCK = 16
CALL_S = 5.0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def prompt(i: int, blocks: int = 16) -> list[int]:
    return [(i * 1009 + t) % 50_000 for t in range(blocks * BLOCK)]


def config(url: str, name: str, **overrides) -> ServiceConfig:
    settings = dict(
        listen="127.0.0.1:0",
        metrics_listen="",
        log_decisions=False,
        heartbeat_ttl_s=600.0,
        drain_grace_s=0.0,
        nats=(url,),
        replica_name=name,
    )
    return dataclasses.replace(ServiceConfig(), **{**settings, **overrides})


class Replica:
    """A started ReplicaServer with stubs for its gRPC services."""

    def __init__(self, server: ReplicaServer) -> None:
        self.server = server
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.server.port}")
        self.router = router_pb2_grpc.RouterStub(self.channel)
        self.registry = router_pb2_grpc.RegistryStub(self.channel)
        self.events = router_pb2_grpc.KvEventsStub(self.channel)
        self.tokens: dict[int, int] = {}

    @property
    def name(self) -> str:
        return self.server.config.replica_name

    @property
    def policy(self):
        return self.server.server.policy

    async def register(self, workers) -> None:
        """Registers each worker; keeps their registration tokens in `tokens`."""
        for worker in workers:
            response = await self.registry.Register(
                pb.RegisterRequest(
                    worker_id=worker,
                    role=pb.ROLE_BOTH,
                    address=f"w{worker}:1",
                    block_size=BLOCK,
                    capacity_blocks=10_000,
                ),
                timeout=CALL_S,
            )
            self.tokens[worker] = response.registration_token

    async def route(self, request_id: str, tokens: list[int], packed: bool = False):
        request = pb.RouteRequest(request_id=request_id, explain=True)
        if packed:
            request.tokens_u32le = array("I", tokens).tobytes()
        else:
            request.tokens.extend(tokens)
        return await self.router.Route(request, timeout=CALL_S)

    async def finished(self, request_id: str) -> None:
        """Reports the request finished, as its gateway does once it is answered."""
        await self.router.ReportLifecycle(
            pb.LifecycleReport(request_id=request_id, event=pb.LIFECYCLE_EVENT_FINISHED),
            timeout=CALL_S,
        )

    async def finished_as_seen_by(self, other: Replica, request_id: str) -> None:
        """Reports the request finished once `other` has its booking, then
        waits until `other` has the finish. A replica's messages arrive in
        order, so no booking of it can reach `other` after its release; with
        no booking seen at first, the release and then the booking could
        both be still on their way once `other` showed none."""
        await until(
            lambda: other.policy.knows_remote(self.name, request_id),
            f"{request_id} to reach {other.name}",
        )
        await self.finished(request_id)
        await until(
            lambda: not other.policy.knows_remote(self.name, request_id),
            f"{request_id}'s finish to reach {other.name}",
        )


@contextlib.asynccontextmanager
async def replicas(url: str, *names: str, **overrides):
    started: list[Replica] = []
    try:
        for name in names:
            server = ReplicaServer(config(url, name, **overrides))
            await server.start()
            started.append(Replica(server))
        yield started
    finally:
        for replica in started:
            await replica.channel.close()
            await replica.server.stop(grace=0)


@contextlib.asynccontextmanager
async def stream_publisher(url: str, worker: int):
    """A kvrouter worker's event sink, publishing to the JetStream stream."""
    nc = await nats.connect(servers=[url])
    publisher = JetStreamWorkerPublisher(nc.jetstream(), NatsConfig(servers=(url,)), worker)
    try:
        await publisher.start()
        yield publisher
    finally:
        await publisher.stop()
        await nc.drain()


def cache(publisher: JetStreamWorkerPublisher, tokens: list[int]) -> None:
    blocks = len(tokens) // BLOCK
    publisher.stored(None, [7_000 + b for b in range(blocks)], tokens)


async def until_indexed(registry, worker: int, blocks: int, timeout_s: float = 15.0) -> None:
    """Waits until the router's List shows `blocks` index blocks of `worker`."""
    deadline = time.monotonic() + timeout_s
    while True:
        listing = await registry.List(pb.ListWorkersRequest(), timeout=CALL_S)
        if {w.worker_id: w.index_blocks for w in listing.workers}.get(worker) == blocks:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {blocks} blocks of worker {worker}")
        await asyncio.sleep(0.01)


def test_stream_events_reach_both_replicas_and_either_routes_to_the_holder(nats_url):
    async def scenario():
        async with replicas(nats_url, "router-a", "router-b") as (a, b):
            for replica in (a, b):
                await replica.register([1, 2, 3, 4])
            async with stream_publisher(nats_url, 3) as publisher:
                cache(publisher, prompt(0))
                await publisher.flush()
            for replica in (a, b):
                await until_indexed(replica.registry, 3, 16)
            assert a.server.replica.index.stats() == b.server.replica.index.stats()
            for i, (replica, other) in enumerate(((a, b), (b, a), (a, b), (b, a))):
                # Each answered, and known answered by the other replica,
                # before the next: the holder is not busy.
                response = await replica.route(f"hit-{i}", prompt(0) + prompt(1, 2))
                await replica.finished_as_seen_by(other, f"hit-{i}")
                assert response.decode_worker == 3
                assert response.decode_address == "w3:1"
                winner = next(c for c in response.explanation.decode_candidates if c.worker_id == 3)
                # The 16 published blocks, plus any this replica predicted for
                # the worker once the shared bookings showed it backlogged.
                assert winner.overlap_device >= 16

    run(scenario())


def test_concurrent_routing_through_both_replicas_spreads_the_load(nats_url):
    workers = range(1, 9)

    async def scenario():
        async with replicas(nats_url, "router-a", "router-b") as (a, b):
            for replica in (a, b):
                await replica.register(workers)
            chosen: dict[str, int] = {}
            blocks_booked = 0

            async def client(replica: Replica, other: Replica, ids, packed: bool):
                nonlocal blocks_booked
                for i in ids:
                    request_id = f"r{i}"
                    response = await replica.route(request_id, prompt(100 + i), packed)
                    chosen[request_id] = response.decode_worker
                    blocks_booked += response.num_blocks
                    # Each client waits for the other replica to hear of its
                    # decision, so at most one decision at a time goes unseen.
                    await until(
                        lambda r=request_id: other.policy.knows_remote(replica.name, r),
                        f"{request_id} to reach {other.name}",
                    )

            await asyncio.gather(
                client(a, b, range(0, 64, 2), packed=False),
                client(b, a, range(1, 64, 2), packed=True),
            )
            counts = Counter(chosen.values())
            assert max(counts[w] for w in workers) - min(counts[w] for w in workers) <= 2
            for replica, other in ((a, b), (b, a)):
                assert other.policy.remote_bookings(replica.name) == 32
            # Each policy scores with the load booked through both replicas:
            # every prompt uncached (whichever way its tokens were sent) and
            # every request's blocks.
            for replica in (a, b):
                loads = [replica.policy.load(w) for w in workers]
                assert sum(load[0] for load in loads) == 64 * 16 * BLOCK
                assert sum(load[1] for load in loads) == blocks_booked
                assert sum(load[2] for load in loads) == 64

            for i in range(64):
                await (a if i % 2 == 0 else b).finished(f"r{i}")
            for replica, other in ((a, b), (b, a)):
                await until(
                    lambda r=replica, o=other: not o.policy.remote_bookings(r.name),
                    f"{replica.name}'s finished requests to reach {other.name}",
                )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await a.router.ReportLifecycle(
                    pb.LifecycleReport(request_id="r0", event=pb.LIFECYCLE_EVENT_FINISHED),
                    timeout=CALL_S,
                )
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND

    run(scenario())


def test_heartbeat_load_reaches_the_shared_policy(nats_url):
    async def scenario():
        async with replicas(nats_url, "router-a") as (a,):
            await a.register([1, 2])
            await a.registry.Heartbeat(
                pb.HeartbeatRequest(
                    worker_id=1,
                    queued_prefill_tokens=10_000_000,
                    registration_token=a.tokens[1],
                ),
                timeout=CALL_S,
            )
            assert a.policy.load(1)[0] == 10_000_000
            for i in range(3):
                assert (await a.route(f"r{i}", prompt(200 + i))).decode_worker == 2

    run(scenario())


def test_events_published_to_a_replica_over_grpc_are_refused(nats_url):
    async def scenario():
        async with replicas(nats_url, "router-a") as (a,):
            await a.register([1])
            call = a.events.Publish(
                iter(
                    [
                        pb.PublishRequest(
                            hello=pb.PublishHello(worker_id=1, next_seq=0, block_size=BLOCK)
                        )
                    ]
                ),
                timeout=CALL_S,
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async for _ in call:
                    pass
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "JetStream" in refused.value.details()
            assert a.server.replica.index.stats()["blocks"] == 0

    run(scenario())


def test_replica_settings_follow_flags_env_and_file(tmp_path, monkeypatch, capsys):
    file = tmp_path / "router.toml"
    file.write_text('nats = "nats://file:4222"\nreplica_name = "from-file"\n')
    monkeypatch.setenv("KVROUTER_REPLICA_NAME", "from-env")
    argv = ["serve", "--config", str(file), "--nats-stream", "EVENTS2", "--print-config"]
    assert kvrouter_main(argv) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["nats"] == ["nats://file:4222"]
    assert '"replica_name": "from-env"' in out
    assert '"nats_stream": "EVENTS2"' in out

    monkeypatch.delenv("KVROUTER_REPLICA_NAME")
    assert kvrouter_main(["serve", "--nats", "nats://x:4222", "--print-config"]) == 2
    assert "nats needs replica_name" in capsys.readouterr().err
    argv = ["serve", "--nats", "nats://x:4222", "--replica-name", "a.b", "--print-config"]
    assert kvrouter_main(argv) == 2
    assert "replica name 'a.b'" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_kvrouter_serve_process_serves_a_replica_and_snapshots_at_sigterm(nats_url, tmp_path):
    port = _free_port()
    snapshot = tmp_path / "replica.snap"
    log = open(tmp_path / "router.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvrouter.cli", "serve", "--listen", f"127.0.0.1:{port}",
         "--metrics-listen", "", "--snapshot-path", str(snapshot), "--log-decisions", "false"],
        env={**os.environ, "KVROUTER_NATS": nats_url, "KVROUTER_REPLICA_NAME": "router-p"},
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip

    async def scenario():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            serving = health_pb2.HealthCheckResponse.SERVING
            while True:
                assert proc.poll() is None, (tmp_path / "router.log").read_text()
                with contextlib.suppress(grpc.aio.AioRpcError):
                    check = health_pb2.HealthCheckRequest()
                    if (await health.Check(check, timeout=1)).status == serving:
                        break
                await asyncio.sleep(0.05)
            registry = router_pb2_grpc.RegistryStub(channel)
            for worker in (1, 2):
                await registry.Register(
                    pb.RegisterRequest(
                        worker_id=worker,
                        role=pb.ROLE_BOTH,
                        address=f"w{worker}:1",
                        block_size=BLOCK,
                        capacity_blocks=10_000,
                    ),
                    timeout=CALL_S,
                )
            async with stream_publisher(nats_url, 2) as publisher:
                cache(publisher, prompt(0))
                await publisher.flush()
            await until_indexed(registry, 2, 16)
            router = router_pb2_grpc.RouterStub(channel)
            request = pb.RouteRequest(request_id="r", tokens=prompt(0))
            assert (await router.Route(request, timeout=CALL_S)).decode_worker == 2

    try:
        run(scenario())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        index, marks = snapshot_file.load(snapshot, "exit")
        # It covers the batch that brought the worker's blocks.
        assert marks["stream_position"] >= 1
        assert index.workers()[2][0] == 16
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
