"""The router process: wires the index, the policy and the gRPC services,
serves them on grpc.aio, and drains gracefully on SIGTERM.

Shutdown order: health goes NOT_SERVING, event streams and routing streams
are closed (their clients reconnect elsewhere), in-flight unary calls get
`drain_grace_s` to finish, then the index is snapshotted if configured.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import time
from pathlib import Path

import grpc
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from kvrouter._core import PrefixIndex
from kvrouter.net import auth, logs, tls
from kvrouter.net.addresses import check_bindable
from kvrouter.net.channels import SERVER_KEEPALIVE_OPTIONS
from kvrouter.net.malformed import MalformedRequests
from kvrouter.net.startup import StartupError
from kvrouter.policy import Router
from kvrouter.proto_gen import router_pb2, router_pb2_grpc
from kvrouter.service import decision_log, snapshot_file
from kvrouter.service.config import ServiceConfig, served_model_dirs
from kvrouter.service.events import EventIngest
from kvrouter.service.generate import GenerationProxy, ProxyingRouterService
from kvrouter.service.metrics import ServiceMetrics
from kvrouter.service.registry import RegistryService
from kvrouter.service.routing import service_router
from kvrouter.service.stalls import StallGuard
from kvrouter.service.worker_ids import IdSource
from kvrouter.service.workers import WorkerTable

log = logging.getLogger("kvrouter.service.server")

SERVICE_NAMES = tuple(
    router_pb2.DESCRIPTOR.services_by_name[name].full_name
    for name in ("Router", "Registry", "KvEvents")
)


# Why a router whose index is fed from elsewhere refuses KV events over gRPC.
EVENTS_ELSEWHERE = (
    "this router replica reads KV events from the NATS JetStream stream; publish them "
    "there (`kvrouter bridge` for vLLM/SGLang engines, `JetStreamWorkerPublisher` for "
    "kvrouter workers), not to the router"
)


def _load_index(config: ServiceConfig) -> tuple[PrefixIndex, int]:
    """The index to start with, and the next worker id the registry may assign."""
    if not config.snapshot_path:
        return PrefixIndex(config.block_size, config.max_index_blocks or None), 0
    path = Path(config.snapshot_path)
    snapshot_file.check_writable(path)
    restored = snapshot_file.load(path, config.on_bad_snapshot)
    if restored is None:
        return PrefixIndex(config.block_size, config.max_index_blocks or None), 0
    index, marks = restored
    if index.block_size != config.block_size:
        raise ValueError(
            f"snapshot {path} has block size {index.block_size}, the config {config.block_size}"
        )
    log.info("index restored", extra={"fields": {"path": str(path), **index.stats()}})
    return index, marks["next_worker_id"]


class RouterServer:
    """One router instance. `await start()`, then `await stop()`."""

    def __init__(
        self,
        config: ServiceConfig,
        *,
        index: PrefixIndex | None = None,
        policy: Router | None = None,
        worker_ids: IdSource | None = None,
    ) -> None:
        """`index`, `policy` and `worker_ids` replace the ones the router
        builds itself: a router replica passes the index it feeds from the
        NATS event stream, its router, whose book holds its peers' bookings,
        and the id counter it shares with them. An index passed in is the
        caller's to feed, restore and snapshot, so this server then refuses
        KV events over gRPC and leaves departing workers' entries in it."""
        config.validate()
        self.config = config
        self.owns_index = index is None
        self.index, next_worker_id = _load_index(config) if index is None else (index, 0)
        self.policy = service_router(self.index, config) if policy is None else policy
        if self.policy.index is not self.index or self.index.block_size != config.block_size:
            raise ValueError(
                f"the policy must route over the index, of block size {config.block_size}"
            )
        self.metrics = ServiceMetrics()
        self.workers = WorkerTable(
            self.policy,
            self.index,
            config.heartbeat_ttl_s,
            owns_index=self.owns_index,
            next_id=next_worker_id,
            ids=worker_ids,
        )
        refusal = "" if self.owns_index else EVENTS_ELSEWHERE
        self.events = EventIngest(
            self.index,
            self.workers,
            self.metrics,
            stream_ttl_s=config.event_stream_ttl_s,
            ack_timeout_s=config.event_ack_timeout_s,
            max_batch_events=config.max_batch_events,
            refusal=refusal,
        )
        self.generation = GenerationProxy(self.policy, self.workers, config, config.proxy)
        self.routing = ProxyingRouterService(
            self.policy, self.workers, self.metrics, config, generation=self.generation
        )
        self.registry = RegistryService(self.workers, self.events, config)
        self.health = health.aio.HealthServicer()
        self.port = 0
        self.metrics_port = 0
        self._server: grpc.aio.Server | None = None
        self._metrics_http = None
        self.http_port = 0
        self._front_door = None
        self._tasks: list[asyncio.Task] = []
        self._stopped = asyncio.Event()
        # Set when the shutdown could not write the snapshot.
        self.snapshot_lost = False
        self._add_gauges()

    def _add_gauges(self) -> None:
        m, index, workers = self.metrics, self.index, self.workers
        m.gauge(
            "kvrouter_index_blocks", "Blocks in the prefix index", lambda: index.stats()["blocks"]
        )
        m.gauge(
            "kvrouter_index_workers",
            "Workers with entries in the prefix index",
            lambda: index.stats()["workers"],
        )
        m.gauge(
            "kvrouter_index_table_bytes",
            "Bytes of the prefix index's hash tables, reserved room included",
            lambda: index.stats()["table_bytes"],
        )
        m.gauge("kvrouter_registered_workers", "Registered workers", lambda: len(workers))
        m.gauge(
            "kvrouter_stale_workers",
            "Workers awaiting a resync (not routable)",
            lambda: sum(r.stale for r in workers.records()),
        )
        m.gauge(
            "kvrouter_event_replies_pending",
            "Replies to Publish streams not yet taken by their workers' transports",
            self.events.pending_replies,
        )

    async def start(self) -> None:
        max_bytes = max(4 << 20, self.config.max_prompt_tokens * 5 + (1 << 20))
        server = grpc.aio.server(
            # Malformed bytes are refused before anything reads them, the
            # token checks included.
            interceptors=[
                MalformedRequests(),
                *auth.interceptors(
                    self.config.auth_tokens_file,
                    health_open=self.config.health_open,
                    reflection_open=self.config.reflection_open,
                ),
            ],
            options=[
                ("grpc.max_receive_message_length", max_bytes),
                ("grpc.max_send_message_length", max_bytes),
                ("grpc.so_reuseport", 0),
                *SERVER_KEEPALIVE_OPTIONS,
                # Core holds arrived calls until the asyncio server takes
                # them, one per loop turn, and by default cancels new ones at
                # random once 1,000 wait (all past 3,000). Thousands of
                # clients opening streams at once, or sending lifecycle
                # reports while the loop is busy, pass that: their calls end
                # CANCELLED, or INTERNAL on a stream, before the router sees
                # them. Waiting calls are cheap, so let them queue.
                ("grpc.server.max_pending_requests", 20_000),
                ("grpc.server.max_pending_requests_hard_limit", 40_000),
            ],
        )
        self.routing.add_to_server(server)
        router_pb2_grpc.add_RegistryServicer_to_server(self.registry, server)
        self.events.add_to_server(server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        try:
            check_bindable("--listen", self.config.listen)
            if self.config.metrics_listen:
                check_bindable("--metrics-listen", self.config.metrics_listen)
        except OSError as e:
            raise StartupError(str(e)) from None
        try:
            self.port = tls.add_port(server, self.config)
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            raise StartupError(f"--listen {self.config.listen}: cannot bind")
        if self.config.metrics_listen:
            try:
                self._metrics_http, self.metrics_port = self.metrics.serve(
                    self.config.metrics_listen,
                    authorized=auth.scrape_authorizer(self.config.auth_tokens_file),
                    ssl_context=tls.server_ssl_context(self.config),
                )
            except OSError as e:
                raise StartupError(
                    f"--metrics-listen {self.config.metrics_listen}: {e.strerror.lower()}"
                ) from None
        if self.config.http_listen:
            self._front_door = self._front_door_server()
        await server.start()
        self._server = server
        if self._front_door is not None:
            await self._front_door.start()
            self.http_port = self._front_door.port
        for name in ("", *SERVICE_NAMES):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._tasks.append(asyncio.create_task(self._expire_loop()))
        if decision_log.wanted(self.config.log_decisions):
            self._tasks.append(asyncio.create_task(self.routing.decision_log.run()))
        if self.owns_index and self.index.stats()["workers"]:
            self._tasks.append(asyncio.create_task(self._forget_unclaimed()))
        log.info(
            "router serving",
            extra={
                "fields": {
                    "port": self.port,
                    "metrics_port": self.metrics_port,
                    "http_port": self.http_port,
                    "block_size": self.config.block_size,
                    "pid": os.getpid(),
                }
            },
        )

    def _front_door_server(self):
        """The OpenAI-compatible front door, bound, not yet serving."""
        listen = self.config.http_listen
        try:
            from kvrouter.net.http1_server import Http1Server
            from kvrouter.service.openai.app import FrontDoor
        except ModuleNotFoundError as e:
            raise StartupError(
                f"--http-listen needs {e.name}, not installed: pip install 'kvrouter[frontend]'"
            ) from None
        try:
            door = FrontDoor(
                self.generation,
                self.workers,
                served_model_dirs(self.config.served_models),
                self.config,
                self.metrics.registry,
            )
        except ValueError as e:
            raise StartupError(f"--served-models: {e}") from None
        try:
            return Http1Server(door.app, listen, on_stopped=door.close)
        except OSError as e:
            raise StartupError(f"--http-listen {listen}: {e.strerror.lower()}") from None

    async def _expire_loop(self) -> None:
        period = min(self.config.heartbeat_interval_s, self.config.heartbeat_ttl_s / 4)
        stalls = StallGuard(period, grace_s=self.config.heartbeat_ttl_s)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            if not stalls.may_expire(now):
                continue
            for worker_id in self.workers.expire(now):
                self.metrics.expirations.inc()
                self.events.close_stream(worker_id, "missed its heartbeats")
            self.events.mark_streamless(now)
            self.events.close_unread(now)

    async def _forget_unclaimed(self) -> None:
        """Drops restored index entries of workers that never re-register."""
        await asyncio.sleep(self.config.heartbeat_ttl_s)
        for worker_id in self.index.workers():
            if worker_id not in self.workers:
                self.index.remove_worker(worker_id)
                log.info("restored entries dropped", extra={"fields": {"worker_id": worker_id}})

    async def stop(self, grace: float | None = None) -> None:
        if self._server is None or self._stopped.is_set():
            return
        grace = self.config.drain_grace_s if grace is None else grace
        log.info("draining", extra={"fields": {"grace_s": grace}})
        # Whatever fails on the way down, the router still stops: a second
        # SIGTERM would otherwise find it half stopped, and wait forever.
        try:
            await self.health.enter_graceful_shutdown()
            for task in self._tasks:
                task.cancel()
            self.events.close_all("the router is shutting down")
            self.routing.close_streams()
            # Both drain at once, within the one grace.
            draining = [self._server.stop(grace)]
            if self._front_door is not None:
                draining.append(self._front_door.stop(grace))
            await asyncio.gather(*draining)
            await self.generation.close()
            self.routing.decision_log.flush()
            if self._metrics_http is not None:
                self._metrics_http.shutdown()
                self._metrics_http.server_close()
            if self.owns_index and self.config.snapshot_path:
                self._write_snapshot(Path(self.config.snapshot_path))
        finally:
            self._stopped.set()
            log.info("stopped")

    def _write_snapshot(self, path: Path) -> None:
        data = self.index.snapshot(next_worker_id=self.workers.next_unused_id)
        if not snapshot_file.save(path, data):
            self.snapshot_lost = True
            return
        log.info(
            "index snapshot written", extra={"fields": {"path": str(path), **self.index.stats()}}
        )

    async def wait_stopped(self) -> None:
        await self._stopped.wait()


async def serve(config: ServiceConfig) -> int:
    """Runs a router until SIGTERM or SIGINT, then drains it; returns the
    exit status, 1 if the snapshot could not be written. Raises StartupError
    when it cannot start."""
    try:
        server = RouterServer(config)
    except (OSError, ValueError) as e:
        raise StartupError(str(e)) from None
    # Handled from before the router says it serves, so that a SIGTERM sent
    # as soon as it does still drains it.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    # What exists now (modules, the restored index's Python side, gRPC) lives
    # as long as the process: taking it out of the cyclic collector turns a
    # full collection, a several-ms stall of every call in flight, into
    # microseconds.
    gc.freeze()
    await stop.wait()
    await server.stop()
    return 1 if server.snapshot_lost else 0


def run(config: ServiceConfig) -> int:
    logs.configure(config.log_level, config.log_format)
    return uvloop.run(serve(config))
