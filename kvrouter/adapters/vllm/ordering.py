"""Turns one engine publisher's messages into a gap-free stream per worker.

The index must see every batch of a worker exactly once, in order. PUB/SUB
loses messages (a subscriber that joins late or falls behind), and vLLM's
batch numbers restart at 0 with the engine. With `expected` the batch number
the sink needs next, a message `seq` that arrives live is:

- `seq == expected`: delivered;
- `seq > expected`: a gap. `expected..seq-1` come from the engine's replay
  socket; when its buffer no longer reaches back that far, the worker is
  resynced from the oldest batch from which the run up to `seq` is complete;
- `seq < expected`: a duplicate of a batch a catch-up replay delivered, or,
  when the live numbers went back or replay never delivered it, an engine
  that restarted with an empty cache. The worker is then resynced from batch
  0 of the new run, as far as the replay buffer holds it.

A message can only reveal a loss when it arrives, so the stream also probes
the replay socket when it starts and whenever it has been quiet for a while:
batches it missed are delivered, and an engine that no longer holds the last
batch delivered has restarted, so its worker is cleared.

A resync replaces what the index knows of the worker. Blocks it stored before
the lost batches drop out: routing underestimates that worker's cache until
it fills again, but never counts on blocks that may be gone. (vLLM batches
carry no run id: an engine that restarts and publishes past `expected`
before any of its messages arrive cannot be told from a gap.)
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable

from kvrouter.adapters.sink import BatchSink
from kvrouter.adapters.vllm.config import Stream
from kvrouter.adapters.vllm.convert import EventConverter
from kvrouter.adapters.vllm.wire import EngineBatch, WireError, decode_batch
from kvrouter.events import WorkerBatch

log = logging.getLogger(__name__)

# (replay endpoint, first batch number) -> (payloads by batch number, whether
# the engine answered to the end)
Replay = Callable[[str, int], Awaitable[tuple[dict[int, bytes], bool]]]


class StreamSequencer:
    def __init__(
        self,
        stream: Stream,
        converter: EventConverter,
        sink: BatchSink,
        replay: Replay,
        stats: Counter[str],
    ) -> None:
        self.stream = stream
        self.converter = converter
        self.sink = sink
        self.replay = replay
        self.stats = stats
        self.last_live: int | None = None
        # The newest batch delivered ahead of the live stream by a probe.
        self.probed_upto = -1
        # Where a restarted engine's worker was cleared, so quiet probes do
        # it once.
        self.cleared_at: int | None = None

    async def on_message(self, seq: int, payload: bytes) -> None:
        batch = self._decode(seq, payload)
        worker = self.stream.worker_for(None if batch is None else batch.data_parallel_rank)
        if worker is None:
            worker = self.stream.worker_id
        expected = await self.sink.next_seq(worker)
        went_back = self.last_live is not None and seq <= self.last_live
        self.last_live = seq
        if went_back or self.probed_upto < seq < expected:
            self.stats["restarts"] += 1
            log.warning(
                "engine restarted; resyncing the worker",
                extra={
                    "fields": {
                        **self._where(),
                        "worker_id": worker,
                        "seq": seq,
                        "expected_seq": expected,
                    }
                },
            )
            self.probed_upto = -1
            found, _ = await self._fetch(0, seq)
            await self._deliver_run(worker, 0, seq, {**found, seq: payload}, restarted=True)
        elif seq < expected:
            self.stats["duplicates"] += 1
        elif seq == expected:
            await self._deliver(self._batch(worker, seq, batch))
        else:
            self.stats["gaps"] += 1
            found, _ = await self._fetch(expected, seq)
            await self._deliver_run(worker, expected, seq, {**found, seq: payload})

    async def probe(self) -> None:
        """Catches up on batches no live message has revealed yet."""
        if self.stream.replay_endpoint is None:
            return
        worker = self.stream.worker_id
        expected = await self.sink.next_seq(worker)
        found, answered = await self._fetch(max(expected - 1, 0), None)
        if not answered:
            return
        if expected > 0 and not found:
            await self._restarted_quietly(worker, expected)
            return
        newest = max(found, default=-1)
        if newest >= expected:
            await self._deliver_run(worker, expected, newest, found)
            self.probed_upto = max(self.probed_upto, newest)

    async def _restarted_quietly(self, worker: int, expected: int) -> None:
        """The engine no longer holds the last batch delivered: it restarted,
        and none of its new batches arrived live yet."""
        found, _ = await self._fetch(0, None)
        if not found and self.cleared_at == expected - 1:
            return
        self.stats["restarts"] += 1
        log.warning(
            "engine no longer holds the last batch: it restarted; resyncing the worker",
            extra={"fields": {**self._where(), "worker_id": worker, "seq": expected - 1}},
        )
        self.probed_upto = -1
        if found:
            newest = max(found)
            await self._deliver_run(worker, 0, newest, found, restarted=True)
            self.probed_upto = newest
        else:
            self.converter.forget(worker)
            await self._deliver(WorkerBatch(worker, expected - 1, [], resync=True))
            self.cleared_at = expected - 1

    async def _fetch(self, start: int, before: int | None) -> tuple[dict[int, bytes], bool]:
        if self.stream.replay_endpoint is None or (before is not None and start >= before):
            return {}, False
        self.stats["replays"] += 1
        return await self.replay(self.stream.replay_endpoint, start)

    async def _deliver_run(
        self, worker: int, start: int, end: int, found: dict[int, bytes], restarted: bool = False
    ) -> None:
        """Delivers the complete run of batches that ends at `end`, resyncing
        at its first batch unless it starts at `start` after no restart."""
        first = end
        while first - 1 >= start and first - 1 in found:
            first -= 1
        resync = restarted or first != start
        if resync:
            self.stats["resyncs"] += 1
        if first != start:
            log.warning(
                "batches are gone; resyncing the worker",
                extra={
                    "fields": {
                        "worker_id": worker,
                        "gone_from": start,
                        "gone_to": first - 1,
                        "seq": first,
                    }
                },
            )
        for number in range(first, end + 1):
            batch = self._decode(number, found[number])
            await self._deliver(self._batch(worker, number, batch, resync and number == first))

    def _where(self) -> dict[str, object]:
        return {"engine": self.stream.engine, "dp_rank": self.stream.dp_rank}

    async def _deliver(self, batch: WorkerBatch) -> None:
        await self.sink.deliver(batch)
        self.stats["batches"] += 1

    def _decode(self, seq: int, payload: bytes) -> EngineBatch | None:
        """The batch, or None for one that cannot be read."""
        try:
            batch = decode_batch(payload)
        except WireError as exc:
            self.stats["malformed"] += 1
            log.error(
                "unreadable batch; clearing the worker",
                extra={"fields": {**self._where(), "seq": seq, "error": str(exc)}},
            )
            return None
        for tag in batch.skipped_tags:
            self.stats[f"unknown_event:{tag}"] += 1
        return batch

    def _batch(
        self, worker: int, seq: int, batch: EngineBatch | None, resync: bool = False
    ) -> WorkerBatch:
        """Converted as it is delivered, since conversion counts the offloaded
        blocks a worker holds. An unreadable batch becomes an empty resync: it
        clears the worker rather than risk keeping blocks it removed."""
        if batch is None:
            self.converter.forget(worker)
            return WorkerBatch(worker, seq, [], resync=True)
        if self.stream.worker_for(batch.data_parallel_rank) is None:
            # A rank this engine entry does not hold (its
            # data_parallel_start_rank is wrong): its blocks are not this
            # worker's. The batch still counts, so the stream has no gap.
            self.stats["foreign_rank"] += 1
            return WorkerBatch(worker, seq, [], resync=resync)
        events = self.converter.convert(batch.events, worker, fresh=resync)
        return WorkerBatch(worker, seq, events, resync=resync)
