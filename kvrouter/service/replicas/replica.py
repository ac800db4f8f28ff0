"""One router replica's prefix index, fed from the JetStream stream.

Each replica owns a durable pull consumer named after it and applies every
batch in stream order, so all replicas converge to the same index. Its
snapshot records the stream position it covers; on start the replica
restores it and recreates its consumer just after that position, so a
restart neither rebuilds from scratch nor skips a batch. (A batch that is
already in the snapshot and arrives again is dropped by its number: the
snapshot keeps each worker's position too.)

A worker batch that skips ahead (the stream aged out batches this replica
never read) resyncs that worker here: the replica forgets what it knew of the
worker rather than serve blocks that may be gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import nats.errors
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from kvrouter._core import PrefixIndex
from kvrouter.adapters.nats.codec import decode_batch
from kvrouter.adapters.nats.config import NatsConfig, check_name
from kvrouter.adapters.nats.stream import ensure_stream
from kvrouter.adapters.sink import apply_batch
from kvrouter.service import snapshot_file

log = logging.getLogger(__name__)


class IndexReplica:
    def __init__(
        self,
        nc: Client,
        config: NatsConfig,
        name: str,
        *,
        block_size: int = 16,
        max_blocks: int | None = None,
        snapshot_path: str | Path | None = None,
        snapshot_interval_s: float = 30.0,
        on_bad_snapshot: str = "empty",
        fetch_batch: int = 512,
    ) -> None:
        """`on_bad_snapshot`: "empty" or "exit", as in ServiceConfig."""
        self.nc = nc
        self.js = nc.jetstream()
        self.config = config
        self.name = check_name(name)
        self.snapshot_path = Path(snapshot_path) if snapshot_path else None
        self.snapshot_interval_s = snapshot_interval_s
        self.on_bad_snapshot = on_bad_snapshot
        self.fetch_batch = fetch_batch
        self.index = PrefixIndex(block_size, max_blocks)
        # The last stream sequence number applied to the index.
        self.position = 0
        # Kept in the snapshot for the replica's worker ids (shared_ids.py):
        # no id below it is handed out again.
        self.next_worker_id = 0
        # batches, duplicates, resyncs, malformed, snapshots
        self.stats: Counter[str] = Counter()
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._last_snapshot = time.monotonic()

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("already started")
        restored = None
        if self.snapshot_path is not None:
            snapshot_file.check_writable(self.snapshot_path)
            restored = snapshot_file.load(self.snapshot_path, self.on_bad_snapshot)
        if restored is not None:
            index, marks = restored
            self.position = marks["stream_position"]
            self.next_worker_id = marks["next_worker_id"]
            if index.block_size != self.index.block_size:
                raise ValueError(
                    f"snapshot {self.snapshot_path} has block size "
                    f"{index.block_size}, the replica {self.index.block_size}"
                )
            self.index = index
            log.info(
                "replica resumes after its stream position",
                extra={"fields": {"replica": self.name, "position": self.position}},
            )
        await ensure_stream(self.js, self.config)
        subscription = await self._subscribe()
        self._task = asyncio.create_task(self._consume(subscription), name=f"replica {self.name}")

    async def stop(self, snapshot: bool = True) -> None:
        if self._task is not None:
            # nats-py may turn the cancellation of a pending fetch into a
            # timeout, which the loop would take for a quiet stream.
            self._stopping = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                await self._task
            self._task = None
        if snapshot:
            await self.save()

    async def save(self) -> None:
        if self.snapshot_path is None:
            return
        data = await asyncio.to_thread(
            self.index.snapshot,
            stream_position=self.position,
            next_worker_id=self.next_worker_id,
        )
        if not await asyncio.to_thread(snapshot_file.save, self.snapshot_path, data):
            return
        self.stats["snapshots"] += 1
        self._last_snapshot = time.monotonic()

    async def _subscribe(self):
        """The durable consumer, recreated to start right after the position
        this replica's index covers."""
        with contextlib.suppress(NotFoundError):
            await self.js.delete_consumer(self.config.stream, self.name)
        start = (
            dict(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.position + 1)
            if self.position
            else dict(deliver_policy=DeliverPolicy.ALL)
        )
        consumer = ConsumerConfig(
            durable_name=self.name,
            ack_policy=AckPolicy.ALL,
            filter_subject=self.config.event_subjects,
            **start,
        )
        return await self.js.pull_subscribe(
            self.config.event_subjects,
            durable=self.name,
            stream=self.config.stream,
            config=consumer,
        )

    async def _consume(self, subscription) -> None:
        while not self._stopping:
            try:
                messages = await subscription.fetch(self.fetch_batch, timeout=0.5)
            except nats.errors.TimeoutError:
                messages = []
            except nats.errors.Error as exc:
                # The client reconnects by itself; the consumer stays durable.
                log.warning(
                    "fetching from the stream failed",
                    extra={"fields": {"replica": self.name, "error": str(exc)}},
                )
                await asyncio.sleep(0.5)
                continue
            for message in messages:
                self._apply(message.data, message.metadata.sequence.stream)
            if messages:
                await messages[-1].ack()
            if (
                self.snapshot_path
                and time.monotonic() - self._last_snapshot > self.snapshot_interval_s
            ):
                await self.save()

    def _apply(self, data: bytes, stream_seq: int) -> None:
        if stream_seq <= self.position:
            return
        self.position = stream_seq
        try:
            batch = decode_batch(data)
        except ValueError as exc:
            # The worker's next batch shows up as a gap and resyncs it.
            self.stats["malformed"] += 1
            log.error(
                "unreadable stream message",
                extra={"fields": {"replica": self.name, "position": stream_seq, "error": str(exc)}},
            )
            return
        status = apply_batch(self.index, batch)
        if status == "gap":
            self.stats["resyncs"] += 1
            log.warning(
                "batch skips ahead; resyncing the worker",
                extra={
                    "fields": {"replica": self.name, "worker_id": batch.worker_id, "seq": batch.seq}
                },
            )
            apply_batch(self.index, replace(batch, resync=True))
        elif status == "duplicate":
            self.stats["duplicates"] += 1
        self.stats["batches"] += 1
