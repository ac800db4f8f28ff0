"""A sidecar that puts vLLM/SGLang engines behind the kvrouter service.

It runs next to the engines, subscribes to their ZMQ sockets on loopback,
registers each DP rank with the router as a worker (with heartbeats) and
forwards the events over the router's KvEvents stream. Each worker speaks
the OpenAI protocol at the engine's `address`, its base URL: the router's
proxied generation reaches the engine there over HTTP. The engines need no
change and the router no ZMQ access to them:

    kvrouter sidecar --router 10.0.0.1:50051 engines.toml

In front of router replicas it registers each DP rank with every replica and
publishes the events to their JetStream stream, as `kvrouter bridge` does:

    kvrouter sidecar --nats nats://10.0.0.1:4222 \
        --router 10.0.0.2:50051 --router 10.0.0.3:50051 engines.toml
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from kvrouter.adapters.nats import EngineBridge, NatsConfig
from kvrouter.adapters.vllm.config import EngineConfig
from kvrouter.adapters.vllm.probe import EngineProbe
from kvrouter.adapters.vllm.subscriber import EngineSubscriber
from kvrouter.client import RouterError, WorkerRegistration
from kvrouter.client.event_stream import GrpcEventTransport
from kvrouter.events import EventPublisher, WorkerBatch
from kvrouter.net.addresses import check_dial
from kvrouter.net.startup import StartupError
from kvrouter.net.worker_protocol import OPENAI, check_address

log = logging.getLogger("kvrouter.adapters.vllm.sidecar")
# How long stopping waits for re-registrations under way.
FOLLOW_GRACE_S = 2.0


class PublisherSink:
    """A `BatchSink` that forwards each worker's batches to its
    `EventPublisher`, which numbers them anew. A resync becomes a `cleared`
    first: the router then forgets what it knew of the worker, as the index
    would on a resync."""

    def __init__(self, publishers: dict[int, EventPublisher]) -> None:
        self.publishers = publishers
        self._next: dict[int, int] = {}

    async def next_seq(self, worker_id: int) -> int:
        return self._next.get(worker_id, 0)

    async def deliver(self, batch: WorkerBatch) -> None:
        publisher = self.publishers[batch.worker_id]
        if batch.resync:
            publisher.cleared()
        publisher.emit(batch.events)
        self._next[batch.worker_id] = batch.seq + 1


class VllmSidecar:
    """`async with VllmSidecar(["router:50051"], engines):`. With `nats`, the
    events go to the JetStream stream, and `routers` are the replicas that
    read it."""

    def __init__(
        self,
        routers: str | Sequence[str],
        engines: list[EngineConfig],
        *,
        block_size: int = 16,
        nats: NatsConfig | None = None,
    ) -> None:
        self.routers = [routers] if isinstance(routers, str) else list(routers)
        if not self.routers:
            raise ValueError("give at least one router")
        if nats is None and len(self.routers) > 1:
            # Replicas refuse events over gRPC: they all read them from the stream.
            raise ValueError("several routers are replicas: publish to their stream (--nats)")
        for router in self.routers:
            check_dial("--router", router)
        if block_size <= 0:
            raise ValueError(f"--block-size must be positive, got {block_size}")
        if not engines:
            raise ValueError("no engines to put behind the routers")
        for engine in engines:
            try:
                check_address(OPENAI, engine.address)
            except ValueError as e:
                raise ValueError(f"engine {engine.name}: {e}") from None
        self.engines = engines
        self.block_size = block_size
        self.nats = nats
        self.registrations: list[WorkerRegistration] = []
        # Per engine, the re-registrations under way for a new capacity, and
        # those that failed (worker, router, capacity), logged once each.
        self._following: dict[str, asyncio.Task] = {}
        self._capacity_failures: set[tuple[int, str, int]] = set()
        self.probes: dict[str, EngineProbe] = {}
        self.publishers: dict[int, EventPublisher] = {}
        self.subscriber: EngineSubscriber | None = None
        self.bridge: EngineBridge | None = None

    async def start(self) -> None:
        try:
            for engine in self.engines:
                probe = EngineProbe(
                    engine.name,
                    engine.address,
                    engine.capacity_blocks,
                    block_size=self.block_size,
                    interval_s=engine.probe_interval_s,
                    timeout_s=engine.probe_timeout_s,
                    on_read=lambda engine=engine: self._capacity_read(engine),
                )
                self.probes[engine.name] = probe
                await probe.start()
            for router in self.routers:
                await self._register(router)
            if self.nats is None:
                await self._forward_to(self.routers[0])
            else:
                self.bridge = EngineBridge(self.nats, self.engines, block_size=self.block_size)
                await self.bridge.start()
        except BaseException:
            await self.stop()
            raise

    async def _register(self, router: str) -> None:
        for engine in self.engines:
            for stream in engine.streams:
                registration = WorkerRegistration(
                    router,
                    role=engine.role,
                    capacity_blocks=self.probes[engine.name].capacity_for(stream.dp_rank),
                    address=engine.address,
                    block_size=self.block_size,
                    worker_id=stream.worker_id,
                    model=engine.model,
                    adapters=engine.adapters,
                    metadata={"engine": engine.name, "dp_rank": str(stream.dp_rank)},
                    load=self._load(engine, stream.dp_rank),
                    protocol=OPENAI,
                    publishes_events=self.nats is None,
                    kv_transfer=engine.kv_transfer,
                    bootstrap_port=engine.bootstrap_port,
                    # Ranks behind one address: each request names its rank.
                    data_parallel_rank=(stream.dp_rank if engine.data_parallel_size > 1 else None),
                )
                try:
                    await registration.start(wait_for_router=True)
                except RouterError as e:
                    raise StartupError(
                        f"--router {router} refused engine {engine.name}: {e}"
                    ) from None
                self.registrations.append(registration)

    def _capacity_read(self, engine: EngineConfig) -> None:
        """After each read of the engine's page: registers its ranks again,
        in a task of their own so that the probes keep their pace, where
        the capacity it states differs from what the routers were told."""
        pending = self._following.get(engine.name)
        if pending is None or pending.done():
            self._following[engine.name] = asyncio.ensure_future(self._follow_capacity(engine))

    async def _follow_capacity(self, engine: EngineConfig) -> None:
        """Registers each of the engine's ranks again whose capacity, as its
        page now states it, differs from what the router was told. A failure
        is retried after the next read, and logged once per router and
        capacity."""
        probe = self.probes[engine.name]
        ranks = {stream.worker_id: stream.dp_rank for stream in engine.streams}
        for registration in list(self.registrations):
            dp_rank = ranks.get(registration.worker_id)
            capacity = None if dp_rank is None else probe.capacity_for(dp_rank)
            if capacity is None or capacity == registration.capacity_blocks:
                continue
            try:
                await registration.set_capacity(capacity)
            except Exception as e:  # retried after the next read
                failure = (registration.worker_id, registration.target, capacity)
                if failure in self._capacity_failures:
                    continue
                self._capacity_failures.add(failure)
                log.warning(
                    "could not register the engine's new KV capacity",
                    extra={
                        "fields": {
                            "engine": engine.name,
                            "router": registration.target,
                            "capacity_blocks": capacity,
                            "error": str(e) or type(e).__name__,
                        }
                    },
                )

    def _load(self, engine: EngineConfig, dp_rank: int):
        """A rank's heartbeat load: its engine's probed load, or None (no
        heartbeat) while the engine fails its probes."""
        probe = self.probes[engine.name]
        # A probe older than one probe interval (plus its timeout) is stale.
        fresh_s = engine.probe_interval_s + engine.probe_timeout_s
        return lambda: probe.load_for(dp_rank, fresh_s)

    async def _forward_to(self, router: str) -> None:
        registered = {r.worker_id: r for r in self.registrations if r.target == router}
        for engine in self.engines:
            for stream in engine.streams:
                registration = registered[stream.worker_id]
                publisher = EventPublisher(
                    GrpcEventTransport(router),
                    stream.worker_id,
                    block_size=self.block_size,
                    registration_token=lambda r=registration: r.registration_token,
                )
                await publisher.start()
                self.publishers[stream.worker_id] = publisher
        self.subscriber = EngineSubscriber(
            self.engines, PublisherSink(self.publishers), block_size=self.block_size
        )
        await self.subscriber.start()

    async def stop(self) -> None:
        for probe in self.probes.values():
            probe.on_read = None
        if self._following:
            # A Register cut off in flight could leave the router holding a
            # token this side never got, and the deregistration below refused.
            await asyncio.wait(self._following.values(), timeout=FOLLOW_GRACE_S)
        for task in self._following.values():
            task.cancel()
        # Their errors were logged where they arose.
        await asyncio.gather(*self._following.values(), return_exceptions=True)
        self._following.clear()
        if self.bridge is not None:
            await self.bridge.stop()
            self.bridge = None
        if self.subscriber is not None:
            await self.subscriber.stop()
            self.subscriber = None
        for publisher in self.publishers.values():
            await publisher.stop()
        self.publishers.clear()
        for registration in self.registrations:
            await registration.stop()
        self.registrations.clear()
        for probe in self.probes.values():
            await probe.stop()
        self.probes.clear()

    async def __aenter__(self) -> VllmSidecar:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()
