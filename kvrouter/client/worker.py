"""`WorkerRegistration`: registers a worker with the router and keeps it
alive with heartbeats carrying its load. If the router forgets the worker
(it restarted, or the worker's heartbeats lapsed) the next heartbeat
registers it again under the same id, with its registration token: if another
process registered that id meanwhile, the router refuses, and this worker
keeps retrying rather than take the newer one's place.

`load` gives each heartbeat's figures; None skips the heartbeat, for a
worker that cannot serve now (an engine failing its health probe): the
router then drops it once its heartbeat TTL passes, and the next heartbeat
after that registers it again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import grpc

from kvrouter.client.background import BackgroundLoop
from kvrouter.client.convert import ROLE_VALUES, rpc_error
from kvrouter.client.types import Registration, Unavailable, WorkerLoad
from kvrouter.net.channels import CHANNEL_OPTIONS, aio_channel
from kvrouter.net.credentials import Credentials
from kvrouter.net.worker_protocol import (
    KV_TRANSFER_NONE,
    KV_TRANSFER_VALUES,
    KVROUTER,
    PROTOCOL_VALUES,
    check_address,
    check_kv_transfer,
)
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

log = logging.getLogger("kvrouter.client.worker")

# Backoff while waiting for a router that is not up yet.
ROUTER_WAIT_INITIAL_S = 0.2
ROUTER_WAIT_MAX_S = 5.0


class WorkerRegistration:
    """Async: `await start()` / `await stop()`. From synchronous code:
    `start_background()` / `stop_background()` run it on a thread of its own."""

    def __init__(
        self,
        target: str,
        *,
        role: str,
        capacity_blocks: int,
        address: str = "",
        block_size: int = 16,
        worker_id: int | None = None,
        model: str = "",
        adapters: Sequence[str] = (),
        metadata: dict[str, str] | None = None,
        protocol: str = KVROUTER,
        publishes_events: bool = False,
        kv_transfer: str = KV_TRANSFER_NONE,
        bootstrap_port: int = 0,
        data_parallel_rank: int | None = None,
        load: Callable[[], WorkerLoad | None] | None = None,
        timeout: float = 5.0,
        credentials: Credentials | None = None,
    ) -> None:
        if role not in ROLE_VALUES:
            raise ValueError(f"role must be one of {', '.join(ROLE_VALUES)}")
        check_address(protocol, address)
        check_kv_transfer(protocol, kv_transfer, role, bootstrap_port)
        self.target = target
        self.role = role
        self.capacity_blocks = capacity_blocks
        self.address = address
        self.block_size = block_size
        self.worker_id = worker_id
        # The model it serves, as requests name it; its adapters on that model.
        self.model = model
        self.adapters = tuple(adapters)
        self.metadata = dict(metadata or {})
        # What `address` speaks: "kvrouter" (a kvrouter worker's gRPC
        # address) or "openai" (an OpenAI-compatible server's base URL).
        self.protocol = protocol
        # It streams KV events to this router: the router stops routing to
        # it while that stream is gone, whatever its index holds.
        self.publishes_events = publishes_events
        # How an OpenAI engine takes part in a split request: "none",
        # "vllm" (kv_transfer_params) or "sglang" (bootstrap, on
        # `bootstrap_port` of the address's host).
        self.kv_transfer = kv_transfer
        self.bootstrap_port = bootstrap_port
        # The engine's DP rank it stands for, when ranks share `address`:
        # the router names it in each request (X-data-parallel-rank).
        self.data_parallel_rank = data_parallel_rank
        self.load = load or WorkerLoad
        self.timeout = timeout
        self.credentials = credentials
        self.registration: Registration | None = None
        # Proves this process's registration to the router; 0 before the first.
        self.registration_token = 0
        self.registrations = 0
        # One Register at a time: a new capacity and a re-registration after
        # the router forgot the worker would otherwise race with one token.
        self._registering = asyncio.Lock()
        self._channel: grpc.aio.Channel | None = None
        self._stub: router_pb2_grpc.RegistryStub | None = None
        self._task: asyncio.Task | None = None
        self._bg: BackgroundLoop | None = None

    async def start(self, *, wait_for_router: bool = False) -> Registration:
        """Registers (raising RouterError if refused) and starts heartbeats.
        With `wait_for_router`, a router that is not up yet (UNAVAILABLE) is
        waited for, retrying with backoff and logging each wait, as a worker
        started before its router must (under Kubernetes, exiting would
        crash-loop it)."""
        self._channel = aio_channel(self.target, self.credentials, CHANNEL_OPTIONS)
        self._stub = router_pb2_grpc.RegistryStub(self._channel)
        try:
            registration = await (self._register_when_up() if wait_for_router else self._register())
        except BaseException:
            await self._channel.close()
            raise
        self._task = asyncio.ensure_future(self._heartbeats())
        return registration

    async def _register(self) -> Registration:
        async with self._registering:
            return await self._register_once()

    async def _register_once(self) -> Registration:
        request = pb.RegisterRequest(
            role=ROLE_VALUES[self.role],
            address=self.address,
            block_size=self.block_size,
            capacity_blocks=self.capacity_blocks,
            model=self.model,
            adapters=self.adapters,
            metadata=self.metadata,
            protocol=PROTOCOL_VALUES[self.protocol],
            publishes_events=self.publishes_events,
            kv_transfer=KV_TRANSFER_VALUES[self.kv_transfer],
            bootstrap_port=self.bootstrap_port,
            registration_token=self.registration_token,
        )
        if self.worker_id is not None:
            request.worker_id = self.worker_id
        if self.data_parallel_rank is not None:
            request.data_parallel_rank = self.data_parallel_rank
        try:
            response = await self._stub.Register(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        self.worker_id = response.worker_id
        self.registration_token = response.registration_token
        self.registrations += 1
        self.registration = Registration(
            response.worker_id,
            response.heartbeat_interval_s,
            response.heartbeat_ttl_s,
            self.metadata,
        )
        return self.registration

    async def _register_when_up(self) -> Registration:
        delay = ROUTER_WAIT_INITIAL_S
        while True:
            try:
                return await self._register()
            except Unavailable as e:
                log.info(
                    "waiting for the router",
                    extra={"fields": {"router": self.target, "retry_s": delay, "error": str(e)}},
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, ROUTER_WAIT_MAX_S)

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.registration.heartbeat_interval_s)
            load = self.load()
            if load is None:
                continue
            request = pb.HeartbeatRequest(
                worker_id=self.worker_id,
                queued_prefill_tokens=load.queued_prefill_tokens,
                active_decode_blocks=load.active_decode_blocks,
                active_requests=load.active_requests,
                registration_token=self.registration_token,
            )
            try:
                await self._stub.Heartbeat(request, timeout=self.timeout)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    log.warning(
                        "router forgot this worker; registering again",
                        extra={"fields": {"worker_id": self.worker_id}},
                    )
                    await self._reregister()
                else:
                    log.warning(
                        "heartbeat failed",
                        extra={"fields": {"worker_id": self.worker_id, "code": e.code().name}},
                    )

    async def set_capacity(self, capacity_blocks: int) -> None:
        """Registers again with another KV capacity (an engine restarted with
        another cache size). Raises RouterError if the router refuses, and
        keeps the capacity it had, so that a later call retries."""
        async with self._registering:
            if capacity_blocks == self.capacity_blocks:
                return
            previous, self.capacity_blocks = self.capacity_blocks, capacity_blocks
            try:
                await self._register_once()
            except BaseException:
                self.capacity_blocks = previous
                raise
        log.info(
            "registered again with a new KV capacity",
            extra={
                "fields": {
                    "worker_id": self.worker_id,
                    "capacity_blocks": capacity_blocks,
                    "was": previous,
                }
            },
        )

    async def _reregister(self) -> None:
        try:
            await self._register()
        except Exception as e:  # retried at the next heartbeat
            log.warning(
                "registration failed",
                extra={"fields": {"worker_id": self.worker_id, "error": str(e)}},
            )

    async def stop(self, deregister: bool = True) -> None:
        """Stops heartbeats and (by default) leaves the router."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if deregister and self._stub is not None and self.worker_id is not None:
            try:
                await self._stub.Deregister(
                    pb.DeregisterRequest(
                        worker_id=self.worker_id, registration_token=self.registration_token
                    ),
                    timeout=self.timeout,
                )
            except grpc.RpcError as e:
                log.info(
                    "deregistration failed",
                    extra={"fields": {"worker_id": self.worker_id, "code": e.code().name}},
                )
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    def start_background(self) -> Registration:
        self._bg = BackgroundLoop(f"heartbeat-{self.worker_id or 'new'}")
        try:
            return self._bg.run(self.start())
        except BaseException:
            self._bg.stop()
            self._bg = None
            raise

    def stop_background(self, deregister: bool = True) -> None:
        if self._bg is not None:
            self._bg.run(self.stop(deregister))
            self._bg.stop()
            self._bg = None
