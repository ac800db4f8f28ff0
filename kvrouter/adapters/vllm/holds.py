"""How many announcements of each offloaded block are outstanding.

vLLM's offloading connector (self-describing mode) announces host and disk
blocks per chunk: a hash that two chunks share is stored twice, and each
chunk's eviction removes it once. The index keeps one copy of a block per
worker and tier, so the first removal would drop a block the engine still
holds in the other chunk. Removals therefore reach the index only when a
block's last announcement goes. GPU blocks are not counted: vLLM's block pool
announces each once and removes it once, and re-announces reused blocks
without a matching removal when it reports them in full
(`kv_cache_report_mode`), which counting would turn into blocks never removed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from kvrouter.events import Tier


class OffloadedHolds:
    def __init__(self) -> None:
        self._held: dict[int, Counter[tuple[Tier, int]]] = {}

    def stored(self, worker: int, tier: Tier, ids: Iterable[int]) -> None:
        if tier != Tier.DEVICE:
            self._held.setdefault(worker, Counter()).update((tier, i) for i in ids)

    def removed(self, worker: int, tier: Tier, ids: Iterable[int]) -> list[int]:
        """The blocks whose last announcement this removal ends."""
        if tier == Tier.DEVICE:
            return list(ids)
        held = self._held.get(worker, Counter())
        gone = []
        for block in ids:
            key = (tier, block)
            if held[key] > 1:
                held[key] -= 1
                continue
            held.pop(key, None)
            gone.append(block)
        return gone

    def forget(self, worker: int) -> None:
        self._held.pop(worker, None)
