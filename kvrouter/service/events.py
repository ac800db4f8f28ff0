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
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from kvrouter._core import PrefixIndex
from kvrouter.events.core import core_events
from kvrouter.events.proto import events_from_proto
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc
from kvrouter.service.errors import ServiceError, invalid
from kvrouter.service.metrics import ServiceMetrics
from kvrouter.service.workers import WorkerTable

log = logging.getLogger("kvrouter.service.events")
LAST_SEQ = 2**64 - 1


class _Stream:
    """One open Publish stream: its worker and the replies waiting to go out."""

    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id
        self.outbox: asyncio.Queue[pb.PublishReply | None] = asyncio.Queue()
        self.error: ServiceError | None = None

    def send(self, reply: pb.PublishReply) -> None:
        self.outbox.put_nowait(reply)

    def close(self, error: ServiceError | None = None) -> None:
        self.error = error
        self.outbox.put_nowait(None)


class EventIngest(router_pb2_grpc.KvEventsServicer):
    def __init__(
        self,
        index: PrefixIndex,
        workers: WorkerTable,
        metrics: ServiceMetrics,
        *,
        stream_ttl_s: float,
        refusal: str = "",
    ) -> None:
        self.index = index
        self.stream_ttl_s = stream_ttl_s
        # Set when the index takes its events from elsewhere: every Publish
        # stream is refused with it (FAILED_PRECONDITION).
        self.refusal = refusal
        self.workers = workers
        self.metrics = metrics
        self._streams: dict[int, _Stream] = {}
        # Workers whose index entries await a resync: the batch number expected.
        self._awaiting: dict[int, int] = {}
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
        """Marks stale each worker with index entries that has had no stream
        for `stream_ttl_s`. (The index of a router that takes its events from
        elsewhere follows that stream alone.)"""
        if self.refusal:
            return
        indexed = self.index.workers()
        for record in self.workers.records():
            worker_id = record.worker_id
            if worker_id in self._streams or worker_id not in indexed:
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

    async def Publish(self, request_iterator, context):
        if self.refusal:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, self.refusal)
        try:
            first = await anext(aiter(request_iterator))
            stream = self._open(first)
        except StopAsyncIteration:
            return
        except ServiceError as e:
            await context.abort(e.code, e.message)
        reader = asyncio.create_task(self._read(stream, request_iterator))
        try:
            while (reply := await stream.outbox.get()) is not None:
                yield reply
            if stream.error is not None:
                await context.abort(stream.error.code, stream.error.message)
        finally:
            reader.cancel()
            if self._streams.get(stream.worker_id) is stream:
                del self._streams[stream.worker_id]

    def _open(self, request: pb.PublishRequest) -> _Stream:
        if request.WhichOneof("kind") != "hello":
            raise invalid("the first message of a Publish stream must be a hello")
        hello = request.hello
        self._check_registered(hello.worker_id)
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
            async for request in request_iterator:
                if request.WhichOneof("kind") != "batch":
                    raise invalid("only event batches may follow the hello")
                self._check_registered(stream.worker_id)
                reply = self._apply(stream.worker_id, request.batch)
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

    def _apply(self, worker_id: int, batch: pb.EventBatch) -> pb.PublishReply | None:
        if batch.seq == LAST_SEQ:
            # Its acknowledgement, seq + 1, would not fit the u64 field.
            raise invalid(f"batch {batch.seq}: batch numbers end at {LAST_SEQ - 1}")
        try:
            events = core_events(events_from_proto(batch.events))
            if batch.resync:
                self.index.resync(worker_id, batch.seq, events)
                outcome = "resync"
            else:
                awaited = self._awaiting.get(worker_id)
                if awaited is not None and batch.seq != awaited:
                    self.metrics.event_batches.labels(outcome="dropped").inc()
                    return None
                result = self.index.apply(worker_id, batch.seq, events)
                outcome = result.status
        except (ValueError, TypeError, KeyError, OverflowError) as e:
            raise invalid(f"batch {batch.seq}: {e}") from None
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
