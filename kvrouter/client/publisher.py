"""`KvEventPublisher`: a worker's KV events, batched, numbered and delivered
to the router's KvEvents service, surviving disconnects.

The engine calls `stored`, `removed` and `cleared` (the event-sink interface)
from any thread; they only append to a list. A background thread cuts the
list into numbered batches (every `flush_interval_s`, or at
`max_batch_events`), keeps unacknowledged batches in a replay buffer and
sends them. When the router asks for a resync it replays from the buffer if
the buffer reaches back far enough, and otherwise sends a full dump: the
events `dump_cache(sink)` produces (the engine walks its cache and calls
`sink.stored(...)` for each sequence). The dump must reflect every event
already passed to the publisher; events emitted while it runs are sent
after it, and applying them twice is harmless.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

import grpc

from kvrouter.client.background import BackgroundLoop
from kvrouter.client.event_sink import EventCollector
from kvrouter.net.channels import CHANNEL_OPTIONS, aio_channel
from kvrouter.net.credentials import Credentials
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

log = logging.getLogger("kvrouter.client.publisher")


class KvEventPublisher:
    """Publishes one worker's KV events. Thread-safe; `start()` it, call the
    sink methods from the engine, `close()` it at shutdown."""

    def __init__(
        self,
        target: str,
        worker_id: int,
        *,
        block_size: int = 16,
        namespace: str = "",
        dump_cache: Callable[[EventCollector], None] | None = None,
        max_batch_events: int = 256,
        flush_interval_s: float = 0.002,
        replay_batches: int = 4096,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 2.0,
        max_pending_events: int = 1_000_000,
        credentials: Credentials | None = None,
    ) -> None:
        self.target = target
        self.worker_id = worker_id
        self.block_size = block_size
        self.dump_cache = dump_cache
        self.max_batch_events = max_batch_events
        self.flush_interval_s = flush_interval_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.max_pending_events = max_pending_events
        self.credentials = credentials
        self._pending = EventCollector(namespace)
        self._buffer: deque[pb.EventBatch] = deque(maxlen=replay_batches)
        self._next_seq = 0
        self._acked = 0
        self._lock = threading.Condition()
        self._cursor: int | None = None
        self._bg: BackgroundLoop | None = None
        self._wake: asyncio.Event | None = None
        self._closing = False
        self._runner: asyncio.Future | None = None
        self.connected = False
        self.resyncs_answered = 0
        # A new publisher (say, a restarted worker) may reuse batch numbers
        # that the router applied from its previous life, so its first batch
        # is a resync: it replaces the old entries whatever the numbers say.
        self._fresh = True
        self.overflows = 0
        self.dumps_sent = 0

    # -- the event sink (any thread)
    def stored(
        self,
        parent_block_id: int | None,
        block_ids: Iterable[int],
        token_ids: Iterable[int],
        tier="device",
        namespace: str | None = None,
    ) -> None:
        """The engine cached `block_ids` (block_size tokens each) after `parent_block_id`."""
        with self._lock:
            self._pending.stored(parent_block_id, block_ids, token_ids, tier, namespace)
            self._added()

    def removed(self, block_ids: Iterable[int], tier="device") -> None:
        """The engine evicted `block_ids` from `tier`."""
        with self._lock:
            self._pending.removed(block_ids, tier)
            self._added()

    def cleared(self) -> None:
        """The engine dropped its whole cache."""
        with self._lock:
            self._pending.cleared()
            self._added()

    def _added(self) -> None:
        count = len(self._pending.events)
        if count > self.max_pending_events:
            self._overflow()
            return
        if (count == 1 or count >= self.max_batch_events) and self._bg is not None:
            self._bg.call_soon(self._kick)

    # -- lifecycle
    def start(self) -> KvEventPublisher:
        self._bg = BackgroundLoop(f"kv-events-{self.worker_id}")
        self._bg.run(self._setup())
        return self

    async def _setup(self) -> None:
        self._wake = asyncio.Event()
        self._runner = asyncio.ensure_future(self._run())

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until every event emitted so far is acknowledged; False on timeout."""
        if self._bg is None:
            raise RuntimeError("start() the publisher before flushing it")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._cut()
            target = self._next_seq
        self._bg.call_soon(self._kick)
        with self._lock:
            while self._acked < target:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._lock.wait(remaining)
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Delivers what it can within `timeout`, then stops; later events are dropped."""
        if self._bg is None:
            return
        self.flush(timeout)
        self._closing = True
        self._bg.run(self._shutdown())
        self._bg.stop()
        self._bg = None

    async def _shutdown(self) -> None:
        self._runner.cancel()
        try:
            await self._runner
        except asyncio.CancelledError:
            pass

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def pending_events(self) -> int:
        """Events not yet cut into a batch; at most `max_pending_events`."""
        return len(self._pending.events)

    # -- batching and the replay buffer (under the lock)
    def _cut(self) -> None:
        if self._pending.events:
            self._buffer.append(
                pb.EventBatch(
                    seq=self._next_seq, events=self._pending.events, emitted_at=time.time()
                )
            )
            self._next_seq += 1
            self._pending.events = []

    def _on_ack(self, next_seq: int) -> None:
        with self._lock:
            while self._buffer and self._buffer[0].seq < next_seq:
                self._buffer.popleft()
            self._acked = max(self._acked, next_seq)
            self._lock.notify_all()
        if self._cursor is None or self._cursor < next_seq:
            self._cursor = next_seq

    def _overflow(self) -> None:
        """Bounds memory while the router is away or slower than the engine:
        drops what is pending and skips a batch number, so the router sees a
        gap and asks for a resync, which the dump answers."""
        self._pending.events = []
        self._buffer.clear()
        self._next_seq += 1
        self.overflows += 1
        log.warning(
            "pending events over the bound; dropped, a resync will follow",
            extra={"fields": {"worker_id": self.worker_id, "bound": self.max_pending_events}},
        )

    def _start_fresh(self) -> None:
        """The first batch this publisher sends: everything it has emitted,
        as a resync, or a dump when the buffer no longer holds it all."""
        self._fresh = False
        with self._lock:
            self._cut()
            if not self.overflows and (not self._buffer or self._buffer[0].seq == 0):
                events = [event for batch in self._buffer for event in batch.events]
                self._buffer.clear()
                self._buffer.append(
                    pb.EventBatch(
                        seq=self._next_seq, events=events, resync=True, emitted_at=time.time()
                    )
                )
                self._cursor = self._next_seq
                self._next_seq += 1
                return
        self._dump()

    def _on_resync(self, expected: int) -> None:
        """Replays from the buffer when it reaches back to `expected`, else dumps."""
        self.resyncs_answered += 1
        with self._lock:
            self._cut()
            first = self._buffer[0].seq if self._buffer else self._next_seq
            if first <= expected <= self._next_seq:
                if expected == self._next_seq:
                    # Nothing to replay: an empty batch brings the router level.
                    self._buffer.append(pb.EventBatch(seq=self._next_seq, emitted_at=time.time()))
                    self._next_seq += 1
                self._cursor = expected
                return
        self._dump()

    def _dump(self) -> None:
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            earlier = self._pending.events
            self._pending.events = []
            self._buffer.clear()
        if self.dump_cache is not None:
            collector = EventCollector(self._pending.namespace)
            self.dump_cache(collector)
            events = collector.events
        else:
            # Without a dump the best true statement is what is still pending.
            events = earlier
        with self._lock:
            self._buffer.appendleft(
                pb.EventBatch(seq=seq, events=events, resync=True, emitted_at=time.time())
            )
        self._cursor = seq
        self.dumps_sent += 1
        log.info(
            "resync dump",
            extra={"fields": {"worker_id": self.worker_id, "seq": seq, "events": len(events)}},
        )

    # -- the connection (on the background loop)
    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        backoff = self.backoff_initial_s
        while not self._closing:
            async with aio_channel(self.target, self.credentials, CHANNEL_OPTIONS) as channel:
                try:
                    await self._session(router_pb2_grpc.KvEventsStub(channel))
                    backoff = self.backoff_initial_s
                except grpc.RpcError as e:
                    self._on_stream_error(e)
                self.connected = False
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
            backoff = min(backoff * 2, self.backoff_max_s)

    def _on_stream_error(self, e: grpc.RpcError) -> None:
        if e.code() == grpc.StatusCode.INVALID_ARGUMENT and self.connected:
            # The router refused a batch, or forgot this worker mid-stream: a
            # replay would be refused or incomplete, so the next resync is a
            # dump. (A refused hello, before registration, keeps the buffer.)
            with self._lock:
                self._buffer.clear()
        log.warning(
            "event stream ended",
            extra={
                "fields": {"worker_id": self.worker_id, "code": e.code().name, "error": e.details()}
            },
        )

    async def _session(self, stub) -> None:
        call = stub.Publish()
        with self._lock:
            self._cut()
            hello = pb.PublishHello(
                worker_id=self.worker_id, next_seq=self._next_seq, block_size=self.block_size
            )
        self._cursor = None
        await call.write(pb.PublishRequest(hello=hello))
        reader = asyncio.ensure_future(self._read(call))
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                if reader.done():
                    break
                # Let a burst of events gather into one batch.
                await asyncio.sleep(self.flush_interval_s)
                await self._send_ready(call)
            reader.result()
        finally:
            reader.cancel()
            call.cancel()

    async def _read(self, call) -> None:
        """Handles the router's replies; wakes the sender for each, and at the end."""
        try:
            async for reply in call:
                self.connected = True
                if self._fresh:
                    self._start_fresh()
                elif reply.WhichOneof("kind") == "ack":
                    self._on_ack(reply.ack.next_seq)
                else:
                    self._on_resync(reply.resync.expected_seq)
                self._kick()
        finally:
            self._kick()

    async def _send_ready(self, call) -> None:
        """Cuts pending events and sends the buffered batches from the cursor on."""
        if self._cursor is None:
            return
        with self._lock:
            self._cut()
            batches = [b for b in self._buffer if b.seq >= self._cursor]
        for batch in batches:
            if self._cursor != batch.seq:
                return  # a resync moved the cursor while this was writing
            await call.write(pb.PublishRequest(batch=batch))
            if self._cursor == batch.seq:
                self._cursor = batch.seq + 1
