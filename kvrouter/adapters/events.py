"""Engine-neutral KV event batches, as adapters hand them to a sink.

They mirror the index's events (`kvrouter._core`) but stay plain data, so a
batch can also be encoded and sent on (see `kvrouter.adapters.nats.codec`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvrouter._core import Cleared, Removed, Stored


@dataclass(frozen=True)
class StoredBlocks:
    """Consecutive blocks of one sequence after `parent` (engine ids); the
    router hashes `token_ids` (block_size per block) itself."""

    block_ids: list[int]
    token_ids: list[int]
    parent: int | None = None
    tier: str = "device"
    namespace: str = ""

    def to_core(self) -> Stored:
        return Stored(self.block_ids, self.token_ids, parent=self.parent, tier=self.tier,
                      namespace=self.namespace)


@dataclass(frozen=True)
class RemovedBlocks:
    block_ids: list[int]
    tier: str = "device"

    def to_core(self) -> Removed:
        return Removed(self.block_ids, tier=self.tier)


@dataclass(frozen=True)
class ClearedAll:
    def to_core(self) -> Cleared:
        return Cleared()


Event = StoredBlocks | RemovedBlocks | ClearedAll


@dataclass
class WorkerBatch:
    """Batch `seq` of one worker's gap-free stream. With `resync`, the events
    are the worker's whole cache and replace what the index knows of it."""

    worker_id: int
    seq: int
    events: list[Event] = field(default_factory=list)
    resync: bool = False
