"""A gRPC proxy between the workers and the router that loses or duplicates
KV event batches on request: how bench/chaos_soak.py injects those faults
into real `kvrouter worker` processes without a hook in them.

Registry calls pass through as bytes. Each Publish stream is relayed
message by message; `arm(worker_id, fault)` makes the next batch of that
worker's stream vanish ("drop") or arrive twice ("duplicate"). The router
sees exactly what a lossy hop would give it: a gap at the next batch (it
asks for a resync) or a batch it already applied. A failure of the router
reaches the worker as the same status code, so the publisher's reconnects
and the registration's retries run as they would without the proxy. The
channels to the router are the workers' own, one for one: each worker
connection's Registry calls share one (as a `WorkerRegistration`'s do), and
each Publish stream has a fresh one (as each publisher session does), so
reconnect backoff after a router outage is what it would be without it.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable

import grpc

from kvrouter.client.background import BackgroundLoop
from kvrouter.net.channels import CHANNEL_OPTIONS, SERVER_OPTIONS
from kvrouter.proto_gen import router_pb2 as pb

REGISTRY = pb.DESCRIPTOR.services_by_name["Registry"]
PUBLISH = "/kvrouter.v1.KvEvents/Publish"
FAULTS = ("drop", "duplicate")


class EventFaultProxy(grpc.GenericRpcHandler):
    """Serves on a thread of its own; `upstream()` is read per call, so the
    router may be (re)started after the proxy."""

    def __init__(self, upstream: Callable[[], str]) -> None:
        self.upstream = upstream
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._lock = threading.Lock()
        self._armed: dict[int, str] = {}
        # Workers with a Publish stream open now.
        self._streams: Counter[int] = Counter()
        self.done: Counter[str] = Counter()
        self._unary = {f"/{REGISTRY.full_name}/{m.name}" for m in REGISTRY.methods}
        self._bg = BackgroundLoop("event-fault-proxy")
        self.port = self._bg.run(self._start())
        self.target = f"127.0.0.1:{self.port}"

    async def _start(self) -> int:
        self._server = grpc.aio.server(options=SERVER_OPTIONS)
        self._server.add_generic_rpc_handlers([self])
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        return port

    def _registry_channel(self, peer: str) -> grpc.aio.Channel:
        key = f"{self.upstream()} {peer}"
        if key not in self._channels:
            self._channels[key] = self._fresh_channel()
        return self._channels[key]

    def _fresh_channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(self.upstream(), options=CHANNEL_OPTIONS)

    # -- faults (any thread)
    def publishing(self) -> list[int]:
        """Workers whose event stream passes through the proxy now."""
        with self._lock:
            return sorted(w for w, n in self._streams.items() if n)

    def arm(self, worker_id: int, fault: str) -> None:
        if fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}")
        with self._lock:
            self._armed[worker_id] = fault

    def disarm(self) -> None:
        with self._lock:
            self._armed.clear()

    def _take(self, worker_id: int) -> str | None:
        with self._lock:
            fault = self._armed.pop(worker_id, None)
            if fault is not None:
                self.done[fault] += 1
            return fault

    # -- the relay (on the proxy's loop)
    def service(self, details):
        if details.method == PUBLISH:
            return grpc.stream_stream_rpc_method_handler(self._publish)
        if details.method in self._unary:
            return grpc.unary_unary_rpc_method_handler(self._forward(details.method))
        return None

    def _forward(self, method: str):
        async def forward(request: bytes, context) -> bytes:
            call = self._registry_channel(context.peer()).unary_unary(method)
            try:
                return await call(request, timeout=context.time_remaining())
            except grpc.RpcError as e:
                await context.abort(e.code(), e.details() or "")

        return forward

    async def _publish(self, requests, context):
        channel = self._fresh_channel()
        upstream = channel.stream_stream(PUBLISH)()
        worker: list[int] = []
        relay = asyncio.ensure_future(self._relay(requests, upstream, worker))
        try:
            async for reply in upstream:
                yield reply
        except grpc.RpcError as e:
            await context.abort(e.code(), e.details() or "")
        finally:
            relay.cancel()
            upstream.cancel()
            await channel.close()
            if worker:
                with self._lock:
                    self._streams[worker[0]] -= 1

    async def _relay(self, requests, upstream, worker: list[int]) -> None:
        """The worker's messages to the router, a fault applied where armed."""
        try:
            async for raw in requests:
                message = pb.PublishRequest.FromString(raw)
                if message.WhichOneof("kind") == "hello":
                    worker.append(message.hello.worker_id)
                    with self._lock:
                        self._streams[worker[0]] += 1
                fault = self._take(worker[0]) if worker and message.HasField("batch") else None
                if fault == "drop":
                    continue
                await upstream.write(raw)
                if fault == "duplicate":
                    await upstream.write(raw)
            await upstream.done_writing()
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass  # the router ended the call: the reply side passes on how

    def close(self) -> None:
        async def stop() -> None:
            await self._server.stop(0)
            for channel in self._channels.values():
                await channel.close()

        self._bg.run(stop())
        self._bg.stop()
