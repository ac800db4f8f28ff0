"""A worker's KV cache: blocks pinned by running requests, and unpinned
cached blocks evicted least recently used first."""

from __future__ import annotations

import itertools
from collections import OrderedDict


class BlockCache:
    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.pinned: dict[int, int] = {}  # block -> references
        self.evictable: OrderedDict[int, None] = OrderedDict()  # oldest first
        self.private = 0  # unshared blocks (partial prompt tail, output)
        # Ids for full unshared blocks kept cached after release: negative,
        # so they never collide with a prompt's block ids.
        self._unshared_ids = itertools.count(-1, -1)

    @property
    def used(self) -> int:
        return len(self.pinned) + len(self.evictable) + self.private

    @property
    def active(self) -> int:
        return len(self.pinned) + self.private

    def hit_length(self, blocks: list[int]) -> int:
        """Length of the longest cached prefix of `blocks`."""
        pinned, evictable = self.pinned, self.evictable
        n = 0
        for b in blocks:
            if b not in pinned and b not in evictable:
                break
            n += 1
        return n

    def admit(self, blocks: list[int], hit: int, private: int) -> list[int] | None:
        """Pins the first `hit` blocks (cached) and room for the rest plus
        `private` blocks, evicting as needed. Returns the evicted blocks, or
        None (nothing changed) when it cannot fit."""
        need = len(blocks) - hit + private
        free = self.capacity - self.used
        if need > free + len(self.evictable) - sum(1 for b in blocks[:hit] if b in self.evictable):
            return None
        pinned, evictable = self.pinned, self.evictable
        for b in blocks[:hit]:
            if b in evictable:
                del evictable[b]
                pinned[b] = 1
            else:
                pinned[b] += 1
        evicted = []
        while self.capacity - self.used < need:
            self._evict_one(evicted)
        for b in blocks[hit:]:
            if b in evictable:
                del evictable[b]
            pinned[b] = pinned.get(b, 0) + 1
        self.private += private
        return evicted

    def grow(self, private: int) -> list[int] | None:
        """Room for `private` more unshared blocks, evicting as needed.
        Returns the evicted blocks, or None (nothing changed) when it
        cannot fit."""
        if private > self.capacity - self.active:
            return None
        evicted = []
        while self.capacity - self.used < private:
            self._evict_one(evicted)
        self.private += private
        return evicted

    def _evict_one(self, evicted: list[int]) -> None:
        """Evicts the least recently used block; only prompt blocks, which
        the router indexes, are reported."""
        b, _ = self.evictable.popitem(last=False)
        if b >= 0:
            evicted.append(b)

    def release(self, blocks: list[int], private: int, full_private: int = 0) -> None:
        """Unpins a request's blocks; the deepest become evictable first so a
        prefix outlives its extensions. `full_private` of its `private`
        blocks are full (its generated tokens, say): as in vLLM they stay
        cached, deepest of all, though nothing will ask for them again,
        and take their turn in the LRU order before space counts as free."""
        pinned, evictable = self.pinned, self.evictable
        for _ in range(full_private):
            evictable[next(self._unshared_ids)] = None
        for b in reversed(blocks):
            refs = pinned[b] - 1
            if refs:
                pinned[b] = refs
            else:
                del pinned[b]
                evictable[b] = None
        self.private -= private
