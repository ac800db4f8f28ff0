"""The router's KvEvents Publish stream as a publisher transport.

Per stream: a hello with the worker's next batch number, then batches; the
router answers Ack(next_seq) or ResyncRequest(expected_seq)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from kvrouter.events.model import WorkerBatch
from kvrouter.events.proto import batch_to_proto
from kvrouter.events.transport import Hello, LinkClosed, Reply
from kvrouter.net.channels import CHANNEL_OPTIONS, aio_channel
from kvrouter.net.credentials import Credentials
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc


def _closed(e: grpc.RpcError) -> LinkClosed:
    # INVALID_ARGUMENT: the router refused a batch, or no longer knows the worker.
    return LinkClosed(
        f"{e.code().name}: {e.details()}", refused=e.code() == grpc.StatusCode.INVALID_ARGUMENT
    )


class _StreamLink:
    def __init__(self, call) -> None:
        self.call = call

    async def send(self, batch: WorkerBatch) -> None:
        await self.write(pb.PublishRequest(batch=batch_to_proto(batch)))

    async def write(self, request: pb.PublishRequest) -> None:
        try:
            await self.call.write(request)
        except grpc.RpcError as e:
            raise _closed(e) from None
        except asyncio.InvalidStateError:
            raise LinkClosed("the stream finished") from None

    async def replies(self) -> AsyncIterator[Reply]:
        try:
            async for reply in self.call:
                if reply.WhichOneof("kind") == "ack":
                    yield Reply(reply.ack.next_seq)
                else:
                    yield Reply(reply.resync.expected_seq, resync=True)
        except grpc.RpcError as e:
            raise _closed(e) from None


class GrpcEventTransport:
    """`target` may change between sessions (a worker moving to another router)."""

    def __init__(self, target: str, credentials: Credentials | None = None) -> None:
        self.target = target
        self.credentials = credentials

    @contextlib.asynccontextmanager
    async def connect(self, hello: Hello) -> AsyncIterator[_StreamLink]:
        async with aio_channel(self.target, self.credentials, CHANNEL_OPTIONS) as channel:
            call = router_pb2_grpc.KvEventsStub(channel).Publish()
            try:
                link = _StreamLink(call)
                greeting = pb.PublishHello(
                    worker_id=hello.worker_id,
                    next_seq=hello.next_seq,
                    block_size=hello.block_size,
                    registration_token=hello.registration_token,
                )
                await link.write(pb.PublishRequest(hello=greeting))
                yield link
            finally:
                call.cancel()
