"""gRPC channels to workers, one per address, shared by every call to that
worker (the router's proxy, and decode workers fetching blocks), each
presenting the caller's credentials."""

from __future__ import annotations

import grpc

from kvrouter.net.channels import CHANNEL_OPTIONS, aio_channel
from kvrouter.net.credentials import Credentials
from kvrouter.proto_gen import worker_pb2_grpc

# A restarted worker should be reachable again within a second, not after
# gRPC's default reconnect backoff of up to two minutes.
RECONNECT_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


class WorkerChannels:
    """asyncio: create and use it on one event loop."""

    def __init__(self, credentials: Credentials | None = None) -> None:
        self.credentials = credentials
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, worker_pb2_grpc.WorkerStub] = {}

    def stub(self, address: str) -> worker_pb2_grpc.WorkerStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = aio_channel(address, self.credentials, (*CHANNEL_OPTIONS, *RECONNECT_OPTIONS))
            self._channels[address] = channel
            stub = self._stubs[address] = worker_pb2_grpc.WorkerStub(channel)
        return stub

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()
