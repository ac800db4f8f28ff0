"""Where adapters deliver ordered worker batches (`kvrouter.events.WorkerBatch`).

A `BatchSink` takes whole numbered batches, as an engine's stream brought
them; it is not the engine-facing `kvrouter.events.EventSink`."""

from __future__ import annotations

import logging
from typing import Protocol

from kvrouter._core import PrefixIndex
from kvrouter.events import WorkerBatch
from kvrouter.events.core import core_events

log = logging.getLogger(__name__)


class BatchSink(Protocol):
    async def next_seq(self, worker_id: int) -> int:
        """The batch number the sink needs next from this worker (0 for a
        worker it has never seen)."""

    async def deliver(self, batch: WorkerBatch) -> None:
        """Take batch `next_seq(worker)`, or any resync batch."""


class IndexSink:
    """Applies batches to a local prefix index (the single-router default)."""

    def __init__(self, index: PrefixIndex) -> None:
        self.index = index

    async def next_seq(self, worker_id: int) -> int:
        return next_seq_of(self.index, worker_id)

    async def deliver(self, batch: WorkerBatch) -> None:
        apply_batch(self.index, batch)


def next_seq_of(index: PrefixIndex, worker_id: int) -> int:
    known = index.workers().get(worker_id)
    return 0 if known is None else known[1]


def apply_batch(index: PrefixIndex, batch: WorkerBatch) -> str:
    """Applies one batch; returns the index's status. A batch the index
    rejects as malformed clears the worker instead, because skipping it could
    leave blocks in the index that the worker no longer holds."""
    try:
        events = core_events(batch.events)
        if batch.resync:
            return index.resync(batch.worker_id, batch.seq, events).status
        return index.apply(batch.worker_id, batch.seq, events).status
    except (ValueError, TypeError) as exc:
        log.error(
            "batch rejected; clearing the worker",
            extra={"fields": {"worker_id": batch.worker_id, "seq": batch.seq, "error": str(exc)}},
        )
        return index.resync(batch.worker_id, batch.seq, []).status
