"""A kvrouter engine worker's KV events, published straight to the JetStream
stream (the replica deployment's counterpart of `kvrouter.client`'s
`KvEventPublisher`).

The engine calls `stored`, `removed` and `cleared` (its event-sink
interface) from any thread; they only append. A task on the event loop cuts
the appended events into numbered batches and publishes them, retrying a
batch until the stream takes it, so the stream stays gap-free. A worker
process starts with an empty cache, so its first batch is an empty resync:
replicas drop whatever an earlier run of the worker left in their indexes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

from nats.js import JetStreamContext

from kvrouter.adapters.events import ClearedAll, Event, RemovedBlocks, StoredBlocks, WorkerBatch
from kvrouter.adapters.nats.config import NatsConfig
from kvrouter.adapters.nats.publisher import JetStreamSink

log = logging.getLogger(__name__)


class JetStreamWorkerPublisher:
    def __init__(self, js: JetStreamContext, config: NatsConfig, worker_id: int, *,
                 namespace: str = "", flush_interval_s: float = 0.002) -> None:
        self.sink = JetStreamSink(js, config)
        self.worker_id = worker_id
        self.namespace = namespace
        self.flush_interval_s = flush_interval_s
        self._pending: list[Event] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._next_seq = 0

    # -- the engine's event sink (any thread)
    def stored(self, parent_block_id: int | None, block_ids, token_ids, tier: str = "device",
               namespace: str | None = None) -> None:
        self._add(StoredBlocks(list(block_ids), list(token_ids), parent_block_id, str(tier),
                               self.namespace if namespace is None else namespace))

    def removed(self, block_ids, tier: str = "device") -> None:
        self._add(RemovedBlocks(list(block_ids), str(tier)))

    def cleared(self) -> None:
        self._add(ClearedAll())

    def _add(self, event: Event) -> None:
        with self._lock:
            self._pending.append(event)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    # -- lifecycle (on the event loop)
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._next_seq = await self.sink.next_seq(self.worker_id)
        await self._publish(WorkerBatch(self.worker_id, self._next_seq, [], resync=True))
        self._task = asyncio.create_task(self._run())

    async def flush(self) -> None:
        """Publishes every event appended so far."""
        with self._lock:
            events, self._pending = self._pending, []
        if events:
            await self._publish(WorkerBatch(self.worker_id, self._next_seq, events))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(self.flush_interval_s)  # gather a batch
            await self.flush()

    async def _publish(self, batch: WorkerBatch) -> None:
        delay = 0.05
        while True:
            try:
                await self.sink.deliver(batch)
                self._next_seq = batch.seq + 1
                return
            except Exception as exc:  # the stream is unreachable: keep the batch
                log.warning("worker %d: publishing batch %d failed (%s); retrying",
                            self.worker_id, batch.seq, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
