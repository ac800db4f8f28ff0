"""The KvEvents service: applies each worker's numbered event batches to the
index, acknowledges them, and asks for a resync when batches go missing.

Protocol, per stream: the worker sends a hello with its next batch number.
The router answers Ack(next_seq) when its index is at that point, or a
ResyncRequest(expected_seq) otherwise. Batches are then applied in order.
A batch that skips ahead is not applied: the worker is marked stale (not
routable), later batches are dropped until the missing one arrives (a replay
from the worker's buffer) or a full dump (`resync`) replaces its entries.

A worker with index entries but no open stream for `stream_ttl_s` is stale
too: its publisher is down while its heartbeats go on, so its cache changes
unseen. A stream back level with the index, or its resync, clears the mark.

Bounds: the core decodes each request (no Python objects per event) and
refuses a batch of more than `max_batch_events`; a big one is decoded and
applied on a thread of its own, a slice of the index at a time, so no batch
holds the event loop or the index for long. Replies a worker does not read
cost one pending ack (acks are cumulative), and a stream with a reply unread
for `ack_timeout_s` is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from kvrouter._core import DecodedBatch, PrefixIndex, PublishHello, decode_publish_request
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.service.errors import ServiceError, invalid
from kvrouter.service.metrics import ServiceMetrics
from kvrouter.service.workers import WorkerTable

log = logging.getLogger("kvrouter.service.events")
SERVICE = "kvrouter.v1.KvEvents"
LAST_SEQ = 2**64 - 1
# Requests up to this size are decoded and applied on the event loop (well
# under a millisecond); bigger ones on the events thread.
INLINE_BYTES = 64 << 10
# Replies other than acks a stream may have waiting before it is closed.
MAX_PENDING = 64


class _Stream:
    """One open Publish stream: its worker and the replies waiting to go out.

    Acks are cumulative, so an ack not yet sent is replaced by a newer one: a
    worker that stops reading costs the router one pending ack, not one per
    batch. Other replies (resync requests) are few; past `MAX_PENDING` of
    them the stream is closed."""

    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id
        self.error: ServiceError | None = None
        # Since when (monotonic) gRPC has held the reply being written; None
        # between writes.
        self.writing_since: float | None = None
        # The Publish handler: cancelled to end a stream stuck in a write.
        self.task = asyncio.current_task()
        self._pending: deque[pb.PublishReply] = deque()
        self._wake = asyncio.Event()
        self._closed = False

    def send(self, reply: pb.PublishReply) -> None:
        if self._closed:
            return
        if reply.HasField("ack") and self._pending and self._pending[-1].HasField("ack"):
            self._pending[-1] = reply
        elif len(self._pending) >= MAX_PENDING:
            self.close(
                ServiceError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"worker {self.worker_id} does not read the router's replies",
                )
            )
            return
        else:
            self._pending.append(reply)
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def close(self, error: ServiceError | None = None) -> None:
        """Ends the stream once the replies already queued are out."""
        if not self._closed:
            self._closed = True
            self.error = error
            self._wake.set()

    async def next_reply(self) -> pb.PublishReply | None:
        """The next reply to write; None once the stream is closed and drained."""
        while not self._pending:
            if self._closed:
                return None
            self._wake.clear()
            await self._wake.wait()
        return self._pending.popleft()


@dataclass
class _Turns:
    """A worker's batches waiting for, or holding, their turn to be applied."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    holders: int = 0


class EventIngest:
    def __init__(
        self,
        index: PrefixIndex,
        workers: WorkerTable,
        metrics: ServiceMetrics,
        *,
        stream_ttl_s: float,
        ack_timeout_s: float,
        max_batch_events: int,
        refusal: str = "",
    ) -> None:
        self.index = index
        self.stream_ttl_s = stream_ttl_s
        self.ack_timeout_s = ack_timeout_s
        self.max_batch_events = max_batch_events
        # One thread for big batches: they are applied in the order they came.
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="kvrouter-events")
        # Set when the index takes its events from elsewhere: every Publish
        # stream is refused with it (FAILED_PRECONDITION).
        self.refusal = refusal
        self.workers = workers
        self.metrics = metrics
        self._streams: dict[int, _Stream] = {}
        # Workers whose index entries await a resync: the batch number expected.
        self._awaiting: dict[int, int] = {}
        # Workers with a batch being applied: the turns of their batches.
        self._applying: dict[int, _Turns] = {}
        # Workers with index entries and no stream: since when (monotonic).
        self._streamless_since: dict[int, float] = {}
        # Those of them stale for it.
        self._stream_lapsed: set[int] = set()

    def _expected(self, worker_id: int) -> int:
        return self.index.workers().get(worker_id, (0, 0))[1]

    def request_resync(self, worker_id: int, reason: str) -> None:
        """Asks the worker's open stream for a resync and marks the worker stale
        until it arrives. Without an open stream there is nothing to ask: the
        hello of the worker's next stream compares positions anyway, and a
        worker that publishes no events must not be left unroutable."""
        stream = self._streams.get(worker_id)
        if stream is None:
            return
        expected = self._expected(worker_id)
        self._awaiting[worker_id] = expected
        self.workers.set_stale(worker_id, True)
        self.metrics.resyncs.labels(reason=reason.split(":")[0]).inc()
        log.warning(
            "resync requested",
            extra={"fields": {"worker_id": worker_id, "expected_seq": expected, "reason": reason}},
        )
        stream.send(pb.PublishReply(resync=pb.ResyncRequest(expected_seq=expected, reason=reason)))

    def close_stream(self, worker_id: int, reason: str) -> None:
        """Ends the worker's stream (it left or lapsed) and forgets its resync."""
        stream = self._streams.pop(worker_id, None)
        self._awaiting.pop(worker_id, None)
        self._streamless_since.pop(worker_id, None)
        self._stream_lapsed.discard(worker_id)
        if stream is not None:
            stream.close(ServiceError(grpc.StatusCode.NOT_FOUND, f"worker {worker_id} {reason}"))

    def mark_streamless(self, now: float) -> None:
        """Marks stale each worker that has had no stream for `stream_ttl_s`
        and has index entries or said it publishes. (The index of a router
        that takes its events from elsewhere follows that stream alone.)"""
        if self.refusal:
            return
        indexed = self.index.workers()
        for record in self.workers.records():
            worker_id = record.worker_id
            if worker_id in self._streams or (
                worker_id not in indexed and not record.publishes_events
            ):
                self._streamless_since.pop(worker_id, None)
                continue
            since = self._streamless_since.setdefault(worker_id, now)
            if now - since > self.stream_ttl_s and worker_id not in self._stream_lapsed:
                self._stream_lapsed.add(worker_id)
                self.workers.set_stale(worker_id, True)
                log.warning(
                    "no event stream; worker not routable until it resyncs",
                    extra={"fields": {"worker_id": worker_id, "ttl_s": self.stream_ttl_s}},
                )

    def close_all(self, reason: str) -> None:
        for stream in self._streams.values():
            stream.close(ServiceError(grpc.StatusCode.UNAVAILABLE, reason))
        self._streams.clear()
        self._thread.shutdown(wait=False, cancel_futures=True)

    def pending_replies(self) -> int:
        """Replies queued on open streams, not yet handed to gRPC."""
        return sum(stream.pending for stream in list(self._streams.values()))

    def close_unread(self, now: float) -> None:
        """Ends each stream whose worker has left a reply unread for
        `ack_timeout_s`: its transport no longer takes data, so it would
        never see a resync request either. Its publisher reconnects, or the
        stream TTL marks the worker stale."""
        for stream in list(self._streams.values()):
            since = stream.writing_since
            if since is None or now - since <= self.ack_timeout_s:
                continue
            self.metrics.event_streams_closed.labels(reason="unread").inc()
            log.warning(
                "event stream closed: the worker does not read its acknowledgements",
                extra={"fields": {"worker_id": stream.worker_id, "timeout_s": self.ack_timeout_s}},
            )
            del self._streams[stream.worker_id]
            stream.close()
            if stream.task is not None:
                stream.task.cancel()

    def add_to_server(self, server) -> None:
        """Registers the service. Requests arrive as bytes, for the core to
        decode (`decode_publish_request`)."""
        handlers = {
            "Publish": grpc.stream_stream_rpc_method_handler(
                self.Publish, response_serializer=pb.PublishReply.SerializeToString
            )
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        server.add_registered_method_handlers(SERVICE, handlers)

    async def Publish(self, request_iterator, context):
        if self.refusal:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, self.refusal)
        try:
            first = await anext(aiter(request_iterator))
            stream = self._open(await self._decode(first))
        except StopAsyncIteration:
            return
        except ServiceError as e:
            await context.abort(e.code, e.message)
        reader = asyncio.create_task(self._read(stream, request_iterator))
        try:
            while (reply := await stream.next_reply()) is not None:
                stream.writing_since = time.monotonic()
                yield reply
                stream.writing_since = None
            if stream.error is not None:
                await context.abort(stream.error.code, stream.error.message)
        finally:
            reader.cancel()
            if self._streams.get(stream.worker_id) is stream:
                del self._streams[stream.worker_id]

    async def _decode(self, data: bytes) -> PublishHello | DecodedBatch:
        try:
            return await self._offload(
                len(data),
                decode_publish_request,
                data,
                self.index.block_size,
                self.max_batch_events,
            )
        except ValueError as e:
            raise invalid(str(e)) from None

    async def _offload(self, size: int, call, *args):
        """`call(*args)`, on the events thread when the message is big: the
        core releases the GIL, so the loop goes on serving meanwhile.
        UNAVAILABLE once the router is shutting down (the thread is gone).
        Cancelled (its stream ended), it raises only once the call is over:
        the call goes on on the thread, and what the caller holds meanwhile
        (the worker's turn) it must hold until then."""
        if size <= INLINE_BYTES:
            return call(*args)
        try:
            future = asyncio.get_running_loop().run_in_executor(self._thread, call, *args)
        except RuntimeError:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, "the router is shutting down") from None
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            await asyncio.wait([future])
            raise

    @contextlib.asynccontextmanager
    async def _turn(self, worker_id: int):
        """Holds the worker's turn to apply a batch. A reconnected worker's
        new stream may bring a batch while one from its old stream is still
        being applied a slice at a time on the events thread; applied inline
        meanwhile, the two would interleave. So a worker's batches are
        applied one at a time, in the order they reach this point."""
        turns = self._applying.setdefault(worker_id, _Turns())
        turns.holders += 1
        try:
            async with turns.lock:
                yield
        finally:
            turns.holders -= 1
            if turns.holders == 0:
                del self._applying[worker_id]

    def _open(self, hello: PublishHello | DecodedBatch) -> _Stream:
        if not isinstance(hello, PublishHello):
            raise invalid("the first message of a Publish stream must be a hello")
        self._check_registered(hello.worker_id)
        if hello.registration_token:
            try:
                self.workers.proven(hello.worker_id, hello.registration_token)
            except ServiceError as e:
                raise ServiceError(e.code, f"event stream refused: {e.message}") from None
        if hello.block_size != self.index.block_size:
            raise invalid(
                f"worker block size {hello.block_size} does not match the router's "
                f"{self.index.block_size}"
            )
        previous = self._streams.get(hello.worker_id)
        if previous is not None:
            previous.close(ServiceError(grpc.StatusCode.ABORTED, "replaced by a newer stream"))
        stream = self._streams[hello.worker_id] = _Stream(hello.worker_id)
        self._streamless_since.pop(hello.worker_id, None)
        lapsed = hello.worker_id in self._stream_lapsed
        self._stream_lapsed.discard(hello.worker_id)
        expected = self._expected(hello.worker_id)
        if expected == hello.next_seq and hello.worker_id not in self._awaiting:
            stream.send(pb.PublishReply(ack=pb.Ack(next_seq=expected)))
            if lapsed:
                # Level with the index: nothing changed while it was away.
                self.workers.set_stale(hello.worker_id, False)
        else:
            self.request_resync(
                hello.worker_id,
                f"reconnect: the worker is at batch {hello.next_seq}, the router at {expected}",
            )
        return stream

    def _check_registered(self, worker_id: int) -> None:
        if worker_id not in self.workers:
            raise invalid(f"events from unregistered worker {worker_id}; register it first")

    async def _read(self, stream: _Stream, request_iterator) -> None:
        try:
            async for data in request_iterator:
                reply = await self.ingest(stream.worker_id, data)
                if reply is not None:
                    stream.send(reply)
            stream.close()
        except ServiceError as e:
            self.metrics.event_batches.labels(outcome="rejected").inc()
            log.warning(
                "event stream refused",
                extra={
                    "fields": {
                        "worker_id": stream.worker_id,
                        "code": e.code.name,
                        "error": e.message,
                    }
                },
            )
            stream.close(e)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            stream.close()

    async def ingest(self, worker_id: int, data: bytes) -> pb.PublishReply | None:
        """Applies one serialized PublishRequest that follows the hello; the
        reply to send, if any. ServiceError (INVALID_ARGUMENT) for one that
        is not a well-formed batch."""
        batch = await self._decode(data)
        if not isinstance(batch, DecodedBatch):
            raise invalid("only event batches may follow the hello")
        if batch.seq == LAST_SEQ:
            # Its acknowledgement, seq + 1, would not fit the u64 field.
            raise invalid(f"batch {batch.seq}: batch numbers end at {LAST_SEQ - 1}")
        async with self._turn(worker_id):
            # Checked in its turn: the worker may have left, or a resync been
            # asked for, while it waited.
            self._check_registered(worker_id)
            awaited = self._awaiting.get(worker_id)
            if not batch.resync and awaited is not None and batch.seq != awaited:
                self.metrics.event_batches.labels(outcome="dropped").inc()
                return None
            try:
                result = await self._offload(len(data), self.index.apply_decoded, worker_id, batch)
            except (ValueError, KeyError, OverflowError) as e:
                raise invalid(f"batch {batch.seq}: {e}") from None
        outcome = "resync" if batch.resync else result.status
        self.metrics.event_batches.labels(outcome=outcome).inc()
        if outcome == "gap":
            self.metrics.event_gaps.inc()
            self.request_resync(
                worker_id, f"gap: got batch {batch.seq}, expected {result.expected_seq}"
            )
            return None
        if outcome in ("applied", "resync"):
            if batch.emitted_at > 0:
                self.metrics.event_lag.observe(max(0.0, time.time() - batch.emitted_at))
            if self._awaiting.pop(worker_id, None) is not None:
                self.workers.set_stale(worker_id, False)
                log.info(
                    "worker resynced",
                    extra={"fields": {"worker_id": worker_id, "seq": batch.seq, "how": outcome}},
                )
            return pb.PublishReply(ack=pb.Ack(next_seq=batch.seq + 1))
        return pb.PublishReply(ack=pb.Ack(next_seq=self._expected(worker_id)))
