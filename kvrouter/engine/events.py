"""Where the block manager reports cache changes (KV events).

Block ids in events are the router's chained block hashes, so the router
needs no mapping from engine ids. `stored` carries the blocks' token ids
(flat, block_size per block) so the router can recompute its own hashes.
"""

from __future__ import annotations

from typing import Protocol

# Tier names as the router's `Tier` accepts them.
DEVICE_TIER = "device"


class KvEventSink(Protocol):
    def stored(
        self,
        parent_block_id: int | None,
        block_ids: list[int],
        token_ids: list[int],
        tier: str,
    ) -> None:
        """Consecutive blocks of one sequence, following `parent_block_id`
        (None: they start the sequence), were cached."""

    def removed(self, block_ids: list[int], tier: str) -> None:
        """These blocks left the cache."""

    def cleared(self) -> None:
        """The whole cache was dropped."""


class NullEventSink:
    def stored(self, parent_block_id, block_ids, token_ids, tier) -> None:
        pass

    def removed(self, block_ids, tier) -> None:
        pass

    def cleared(self) -> None:
        pass
