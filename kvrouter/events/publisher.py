"""`EventPublisher`: one worker's KV events, batched, numbered and delivered
over a transport (`kvrouter.events.transport`), surviving disconnects.

Engines call `stored`, `removed` and `cleared` (the event-sink interface)
from any thread; they only append to a list. A task on the publisher's
event loop cuts the list into numbered batches (every `flush_interval_s`,
or at `max_batch_events`), keeps unacknowledged batches in a replay buffer
and sends them. When the receiver asks for a resync the publisher replays
from the buffer if the buffer reaches back far enough, and otherwise sends
a full dump: the events `dump_cache(sink)` produces (the engine walks its
cache and calls `sink.stored(...)` for each sequence; it runs on a thread
of its own). The dump must reflect every event already passed to the
publisher; events emitted while it runs are sent after it, and applying
them twice is harmless.

A new publisher (say, a restarted worker) may reuse batch numbers that the
receiver applied from its previous life, so its first batch is a resync: it
replaces the old entries whatever the numbers say.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from kvrouter._core import model_namespace
from kvrouter.events.model import Event, WorkerBatch
from kvrouter.events.sink import EventList, EventSink
from kvrouter.events.transport import Hello, Link, LinkClosed, Transport

log = logging.getLogger("kvrouter.events.publisher")


class EventPublisher(EventSink):
    """Publishes one worker's KV events. The sink calls are thread-safe; the
    lifecycle runs on an event loop: `await start()`, `await stop()`."""

    def __init__(
        self,
        transport: Transport,
        worker_id: int,
        *,
        block_size: int = 16,
        model: str = "",
        namespace: str = "",
        dump_cache: Callable[[EventSink], None] | None = None,
        registration_token: Callable[[], int] | None = None,
        max_batch_events: int = 256,
        flush_interval_s: float = 0.002,
        replay_batches: int = 4096,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 2.0,
        max_pending_events: int = 1_000_000,
    ) -> None:
        self.transport = transport
        self.worker_id = worker_id
        self.block_size = block_size
        # Stored blocks that name no namespace hash in the served model's,
        # salted by `namespace`: where the router looks the model's requests up.
        self.namespace = model_namespace(model, namespace)
        self.dump_cache = dump_cache
        # The worker's current registration token, read at each (re)connect.
        self.registration_token = registration_token
        self.max_batch_events = max_batch_events
        self.flush_interval_s = flush_interval_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.max_pending_events = max_pending_events
        self._pending: list[Event] = []
        self._buffer: deque[WorkerBatch] = deque(maxlen=replay_batches)
        self._next_seq = 0
        self._acked = 0
        self._lock = threading.Lock()
        # The next batch to send on this session; None until the receiver
        # has said where it is, and while a dump is being built.
        self._cursor: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Made by start(), on the loop that waits on them.
        self._wake: asyncio.Event
        self._progress: asyncio.Event
        self._runner: asyncio.Task | None = None
        self._fresh = True
        self.connected = False
        self.resyncs_answered = 0
        self.overflows = 0
        self.dumps_sent = 0

    # -- the event sink (any thread)
    def emit(self, events: Iterable[Event]) -> None:
        with self._lock:
            was_empty = not self._pending
            self._pending.extend(events)
            count = len(self._pending)
            if count > self.max_pending_events:
                self._overflow()
                return
        if (was_empty and count) or count >= self.max_batch_events:
            self._kick()

    def _kick(self) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._wake.set)
        except RuntimeError:  # the loop closed while an engine thread still reported
            pass

    # -- lifecycle (on the event loop)
    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("the publisher is already started")
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._runner = asyncio.create_task(self._run(), name=f"kv-events-{self.worker_id}")

    async def flush(self, timeout: float | None = None) -> bool:
        """Waits until every event emitted so far is acknowledged; False on timeout."""
        if self._runner is None:
            raise RuntimeError("start() the publisher before flushing it")
        with self._lock:
            self._cut()
            target = self._next_seq
        self._wake.set()
        try:
            async with asyncio.timeout(timeout):
                while self._acked < target:
                    self._progress.clear()
                    await self._progress.wait()
        except TimeoutError:
            return False
        return True

    async def stop(self, timeout: float = 5.0) -> None:
        """Delivers what it can within `timeout`, then stops; later events are not sent."""
        if self._runner is None:
            return
        await self.flush(timeout)
        self._loop = None
        self._runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._runner
        self._runner = None

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def pending_events(self) -> int:
        """Events not yet cut into a batch; at most `max_pending_events`."""
        return len(self._pending)

    # -- batching and the replay buffer (under the lock)
    def _cut(self) -> None:
        if self._pending:
            self._buffer.append(self._batch(self._next_seq, self._pending))
            self._next_seq += 1
            self._pending = []

    def _batch(self, seq: int, events: Iterable[Event], resync: bool = False) -> WorkerBatch:
        return WorkerBatch(self.worker_id, seq, tuple(events), resync, emitted_at=time.time())

    def _overflow(self) -> None:
        """Bounds memory while the receiver is away or slower than the engine:
        drops what is pending and skips a batch number, so the receiver sees a
        gap and asks for a resync, which the dump answers."""
        self._pending = []
        self._buffer.clear()
        self._next_seq += 1
        self.overflows += 1
        log.warning(
            "pending events over the bound; dropped, a resync will follow",
            extra={"fields": {"worker_id": self.worker_id, "bound": self.max_pending_events}},
        )

    # -- the receiver's replies (on the event loop)
    def _on_ack(self, seq: int) -> None:
        with self._lock:
            while self._buffer and self._buffer[0].seq < seq:
                self._buffer.popleft()
            self._acked = max(self._acked, seq)
        self._progress.set()
        if self._cursor is None or self._cursor < seq:
            self._cursor = seq

    async def _start_fresh(self) -> None:
        """The first batch this publisher sends: everything it has emitted,
        as a resync, or a dump when the buffer no longer holds it all."""
        with self._lock:
            self._cut()
            whole = not self.overflows and (not self._buffer or self._buffer[0].seq == 0)
            if whole:
                events = [event for batch in self._buffer for event in batch.events]
                self._buffer.clear()
                self._buffer.append(self._batch(self._next_seq, events, resync=True))
                self._cursor = self._next_seq
                self._next_seq += 1
        if not whole:
            await self._dump()
        self._fresh = False

    async def _on_resync(self, expected: int) -> None:
        """Replays from the buffer when it reaches back to `expected`, else dumps."""
        self.resyncs_answered += 1
        with self._lock:
            self._cut()
            first = self._buffer[0].seq if self._buffer else self._next_seq
            replayable = first <= expected <= self._next_seq
            if replayable:
                if expected == self._next_seq:
                    # Nothing to replay: an empty batch brings the receiver level.
                    self._buffer.append(self._batch(self._next_seq, ()))
                    self._next_seq += 1
                self._cursor = expected
        if not replayable:
            await self._dump()

    async def _dump(self) -> None:
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            earlier = self._pending
            self._pending = []
            self._buffer.clear()
        self._cursor = None
        if self.dump_cache is not None:
            dumped = EventList(self.namespace)
            await asyncio.to_thread(self.dump_cache, dumped)
            events = dumped.events
        else:
            # Without a dump the best true statement is what is still pending.
            events = earlier
        with self._lock:
            self._buffer.appendleft(self._batch(seq, events, resync=True))
        self._cursor = seq
        self.dumps_sent += 1
        log.info(
            "resync dump",
            extra={"fields": {"worker_id": self.worker_id, "seq": seq, "events": len(events)}},
        )

    # -- the link (on the event loop)
    def _hello(self) -> Hello:
        with self._lock:
            self._cut()
            seq = self._next_seq
        token = self.registration_token() if self.registration_token else 0
        return Hello(self.worker_id, seq, self.block_size, token)

    async def _run(self) -> None:
        backoff = self.backoff_initial_s
        while True:
            try:
                async with self.transport.connect(self._hello()) as link:
                    await self._session(link)
                backoff = self.backoff_initial_s
            except LinkClosed as e:
                self._on_link_closed(e)
            except Exception:
                log.exception("event link failed", extra={"fields": {"worker_id": self.worker_id}})
            self.connected = False
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
            backoff = min(backoff * 2, self.backoff_max_s)

    def _on_link_closed(self, e: LinkClosed) -> None:
        if e.refused and self.connected:
            # The receiver refused a batch, or forgot this worker mid-stream: a
            # replay would be refused or incomplete, so the next resync is a
            # dump. (A refused hello, before any reply, keeps the buffer.)
            with self._lock:
                self._buffer.clear()
        log.warning(
            "event link ended",
            extra={"fields": {"worker_id": self.worker_id, "error": str(e)}},
        )

    async def _session(self, link: Link) -> None:
        self._cursor = None
        reader = asyncio.ensure_future(self._read(link))
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                if reader.done():
                    break
                # Let a burst of events gather into one batch.
                await asyncio.sleep(self.flush_interval_s)
                await self._send_ready(link)
            reader.result()
        finally:
            reader.cancel()

    async def _read(self, link: Link) -> None:
        """Handles the receiver's replies; wakes the sender for each, and at the end."""
        try:
            async for reply in link.replies():
                self.connected = True
                if self._fresh:
                    await self._start_fresh()
                elif reply.resync:
                    await self._on_resync(reply.seq)
                else:
                    self._on_ack(reply.seq)
                self._wake.set()
        finally:
            self._wake.set()

    async def _send_ready(self, link: Link) -> None:
        """Cuts pending events and sends the buffered batches from the cursor on."""
        if self._cursor is None:
            return
        with self._lock:
            self._cut()
            batches = [b for b in self._buffer if b.seq >= self._cursor]
        for batch in batches:
            if self._cursor != batch.seq:
                return  # a resync moved the cursor while this was sending
            await link.send(batch)
            if self._cursor == batch.seq:
                self._cursor = batch.seq + 1
