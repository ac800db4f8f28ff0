"""The worker process: loads the engine, serves the Worker service, joins
the router (registration, heartbeats with load) and publishes KV events.
In front of router replicas it registers with each of them and publishes
the events to their NATS JetStream stream. In the engine-compatible mode it
serves vLLM's OpenAI HTTP API and ZMQ KV events as well (engine_mode/), and
joins routers only when it is given some.

Start-up order: every port is bound and the engine loaded before anything
serves, so a setting the worker cannot start with is refused with one line
(StartupError) and nothing left running; then the gRPC server comes up, so
the worker can serve as soon as the router knows it; events emitted before
the publisher exists are held by the sink and replayed to it."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import grpc
import torch
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvrouter.client import RouterError, WorkerLoad, WorkerRegistration
from kvrouter.client.event_stream import GrpcEventTransport
from kvrouter.engine import EngineConfig, LLMEngine
from kvrouter.events import EventPublisher
from kvrouter.events.transport import Transport
from kvrouter.net import auth, logs, tls
from kvrouter.net.addresses import check_bindable
from kvrouter.net.channels import SERVER_OPTIONS
from kvrouter.net.credentials import Credentials
from kvrouter.net.startup import StartupError, flag
from kvrouter.net.worker_channels import WorkerChannels
from kvrouter.proto_gen import worker_pb2, worker_pb2_grpc
from kvrouter.worker.config import WorkerConfig
from kvrouter.worker.engine_loop import EngineLoop
from kvrouter.worker.events import MirroredEventSink
from kvrouter.worker.leases import LeaseTable
from kvrouter.worker.requests import Identity
from kvrouter.worker.service import WorkerService
from kvrouter.worker.transfer import GrpcKvTransfer, KvTransfer

log = logging.getLogger("kvrouter.worker.server")

SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name


class WorkerServer:
    """One worker. `await start()`, then `await stop()`."""

    def __init__(self, config: WorkerConfig, transfer: KvTransfer | None = None) -> None:
        config.validate()
        self.config = config
        self.sink = MirroredEventSink(config.block_size, config.hash_namespace)
        self.credentials = Credentials.from_files(
            config.token_file, config.ca_file, config.client_cert_file, config.client_key_file
        )
        self.channels = WorkerChannels(self.credentials)
        self.transfer = transfer or GrpcKvTransfer(self.channels, config.max_chunk_bytes)
        self.identity = Identity(config.worker_id or 0, "", config.role)
        self.engine_loop: EngineLoop | None = None
        self.leases: LeaseTable | None = None
        self.registrations: list[WorkerRegistration] = []
        self.publisher: EventPublisher | None = None
        self._nats_client = None
        self.engine_api = None
        self.kv_events = None
        self.http = None
        self._server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task] = []
        # Whether it said it serves: a worker that never started leaves quietly.
        self._serving = False

    def _engine(self) -> LLMEngine:
        c = self.config
        if c.torch_threads:
            torch.set_num_threads(c.torch_threads)
        return LLMEngine(
            EngineConfig(
                model=c.model,
                block_size=c.block_size,
                num_kv_blocks=c.num_kv_blocks,
                max_num_seqs=c.max_num_seqs,
                max_num_batched_tokens=c.max_num_batched_tokens,
                attention_backend=c.attention_backend,
                device=c.device,
                namespace=c.hash_namespace,
            ),
            event_sink=self.sink,
        )

    async def start(self) -> None:
        """Raises StartupError, with nothing left running, for a setting the
        worker cannot start with."""
        try:
            await self._start(self.config)
        except BaseException:
            await self.stop(0)
            raise

    async def _start(self, c: WorkerConfig) -> None:
        try:
            check_bindable("--listen", c.listen)
            if c.vllm_http_listen:
                check_bindable("--vllm-http-listen", c.vllm_http_listen)
        except OSError as e:
            raise StartupError(str(e)) from None
        try:
            engine = self._engine()
        except (OSError, ValueError) as e:
            raise StartupError(f"--model {c.model}: cannot load it: {e}") from None
        except KeyError as e:
            raise StartupError(f"--model {c.model}: config.json lacks {e}") from None
        self.engine_loop = EngineLoop(engine, asyncio.get_running_loop())
        self.engine_loop.start()
        self.leases = LeaseTable(self.engine_loop, c.lease_ms / 1000.0)
        service = WorkerService(self.engine_loop, self.leases, self.transfer, c, self.identity)
        server = grpc.aio.server(
            interceptors=auth.interceptors(c.auth_tokens_file, health_open=c.health_open),
            options=SERVER_OPTIONS,
        )
        worker_pb2_grpc.add_WorkerServicer_to_server(service, server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        try:
            port = tls.add_port(server, c)
        except RuntimeError:
            port = 0
        if port == 0:
            raise StartupError(f"--listen {c.listen}: cannot bind")
        if c.vllm_http_listen:
            self._bind_as_vllm(c)
        await server.start()
        self._server = server
        self.identity.address = c.advertise or f"{c.listen.rsplit(':', 1)[0]}:{port}"
        self._tasks.append(asyncio.create_task(self.leases.expire_forever()))
        if c.routers:
            await self._join(c)
        if self.http is not None:
            await self.http.start()
        for name in ("", SERVICE_NAME):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "worker serving",
            extra={
                "fields": {
                    "worker_id": self.identity.worker_id,
                    "role": c.role,
                    "address": self.identity.address,
                    **self._vllm_addresses(),
                    "pid": os.getpid(),
                }
            },
        )
        self._serving = True

    async def _join(self, c: WorkerConfig) -> None:
        worker_id = c.worker_id
        for router in c.routers:
            registration = WorkerRegistration(
                router,
                role=c.role,
                capacity_blocks=c.num_kv_blocks,
                address=self.identity.address,
                block_size=c.block_size,
                worker_id=worker_id,
                model=c.served_model_name,
                metadata={"namespace": c.namespace, "model": os.path.basename(str(c.model))},
                publishes_events=not c.nats,
                load=self._load,
                credentials=self.credentials,
            )
            try:
                worker_id = (await registration.start(wait_for_router=True)).worker_id
            except RouterError as e:
                raise StartupError(f"--router {router} refused this worker: {e}") from None
            self.registrations.append(registration)
        self.identity.worker_id = worker_id
        self.publisher = EventPublisher(
            await self._event_transport(c),
            worker_id,
            block_size=c.block_size,
            namespace=c.hash_namespace,
            dump_cache=self.sink.dump,
            registration_token=self._event_registration_token,
        )
        await self.publisher.start()
        self.sink.attach(self.publisher)

    def _bind_as_vllm(self, c: WorkerConfig) -> None:
        """vLLM's OpenAI HTTP API and ZMQ KV events, on this process's loop:
        bound here, the HTTP API served once the worker has joined."""
        # The frontend and adapters extras: imported only in this mode.
        try:
            from kvrouter.net.http_server import HttpServer
            from kvrouter.worker.engine_mode.app import EngineApi
            from kvrouter.worker.engine_mode.handoff import Handoffs
            from kvrouter.worker.engine_mode.kv_events import ZmqEventPublisher
        except ModuleNotFoundError as e:
            raise StartupError(
                f"--vllm-http-listen needs {e.name}, not installed: "
                "pip install 'kvrouter[engine,frontend,adapters]'"
            ) from None

        try:
            self.kv_events = ZmqEventPublisher(
                c.vllm_kv_events_endpoint,
                c.vllm_kv_events_replay_endpoint,
                block_size=c.block_size,
                buffer_steps=c.vllm_kv_events_buffer_steps,
            )
        except OSError as e:
            replay = e.filename == c.vllm_kv_events_replay_endpoint
            setting = "vllm_kv_events_replay_endpoint" if replay else "vllm_kv_events_endpoint"
            raise StartupError(f"{flag(setting)} {e.filename}: {e.strerror}") from None
        self.sink.attach(self.kv_events)
        # vLLM serves a model under its path unless given a name.
        handoffs = Handoffs(
            self.engine_loop,
            self.leases,
            self.transfer,
            self.channels,
            self.identity,
            c.fetch_timeout_s,
        )
        self.engine_api = EngineApi(
            self.engine_loop,
            handoffs,
            c.served_model_name or str(c.model),
            str(c.model),
            self.engine_loop.engine.max_model_len,
            c.block_size,
            c.num_kv_blocks,
        )
        try:
            self.http = HttpServer(self.engine_api.app(), c.vllm_http_listen, on_stopped=_nothing)
        except OSError as e:
            raise StartupError(
                f"--vllm-http-listen {c.vllm_http_listen}: {e.strerror.lower()}"
            ) from None

    def _vllm_addresses(self) -> dict[str, str]:
        """Where the engine-compatible mode serves (nothing outside it)."""
        if self.http is None:
            return {}
        host = self.config.vllm_http_listen.rpartition(":")[0]
        return {
            "http_address": f"http://{host}:{self.http.port}",
            "kv_events": self.kv_events.endpoint,
            "kv_events_replay": self.kv_events.replay_endpoint,
        }

    def _event_registration_token(self) -> int:
        """The token of the registration with the router the events go to."""
        for registration in self.registrations:
            if registration.target == self.config.router:
                return registration.registration_token
        return 0

    async def _event_transport(self, c: WorkerConfig) -> Transport:
        """The router's event stream, or the replicas' JetStream stream."""
        if not c.nats:
            return GrpcEventTransport(c.router, self.credentials)
        # The NATS client comes with the adapters extra: imported only here.
        import nats

        from kvrouter.adapters.nats import NatsConfig, ensure_stream
        from kvrouter.adapters.nats.transport import JetStreamTransport

        config = NatsConfig(
            servers=c.nats, stream=c.nats_stream, subject_prefix=c.nats_subject_prefix
        )
        self._nats_client = await nats.connect(servers=list(config.servers), name="kvrouter-worker")
        js = self._nats_client.jetstream()
        await ensure_stream(js, config)
        return JetStreamTransport(js, config)

    def _load(self) -> WorkerLoad:
        load = self.engine_loop.load
        return WorkerLoad(
            queued_prefill_tokens=load.waiting_prefill_tokens + load.running_prefill_tokens,
            active_decode_blocks=load.decode_blocks,
            active_requests=load.num_waiting + load.num_running,
        )

    @property
    def address(self) -> str:
        return self.identity.address

    async def stop(self, grace: float = 1.0) -> None:
        """Leaves the routers, lets calls in flight finish for `grace` seconds, stops."""
        if self.engine_api is not None:
            # /health answers 503 from now on: a sidecar takes the worker out of routing.
            self.engine_api.draining = True
        for registration in self.registrations:
            await registration.stop(deregister=True)
        for task in self._tasks:
            task.cancel()
        if self._server is not None:
            await self._server.stop(grace)
        if self.http is not None:
            await self.http.stop(grace)
        if self.publisher is not None:
            await self.publisher.stop(timeout=2.0)
        if self._nats_client is not None:
            await self._nats_client.close()
        if self.engine_loop is not None:
            await asyncio.to_thread(self.engine_loop.stop)
        if self.kv_events is not None:
            await asyncio.to_thread(self.kv_events.close)
        await self.channels.close()
        if self._serving:
            log.info("worker stopped", extra={"fields": {"worker_id": self.identity.worker_id}})


async def _nothing() -> None:
    pass


async def serve(config: WorkerConfig) -> None:
    """Runs a worker until SIGTERM or SIGINT. Raises StartupError when it
    cannot start."""
    try:
        server = WorkerServer(config)
    except (OSError, ValueError) as e:
        raise StartupError(str(e)) from None
    await server.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    await server.stop()


def run(config: WorkerConfig, log_level: str = "info", log_format: str = "json") -> None:
    logs.configure(log_level, log_format)
    uvloop.run(serve(config))
