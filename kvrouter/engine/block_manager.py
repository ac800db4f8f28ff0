"""Paged KV block bookkeeping: reference counts, prefix cache, LRU reuse.

Plain lists and dicts only; the model runner owns the tensors. A block is
identified here by its physical index. Once full and computed, a block is
registered in the prefix cache under the router's chained block hash, which
is also its id in KV events.

Free blocks live in two pools: blocks that were never registered, used
first, and registered (cached) blocks in LRU order, evicted oldest first.
A sequence frees its blocks tail first, so a sequence's unshared tail is
evicted before the prefix other requests are likely to reuse.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass, field

from kvrouter.engine.sequence import Sequence
from kvrouter.events import EventSink, NullEventSink, Tier

# tokens -> chained hashes of the full blocks (partial tail not hashed).
HashFunction = Callable[[list[int]], list[int]]


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: list[int] | None = None


@dataclass
class ImportReservation:
    placed: list[tuple[int, int]] = field(default_factory=list)
    held: list[int] = field(default_factory=list)


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        hash_tokens: HashFunction,
        event_sink: EventSink | None = None,
        enable_prefix_caching: bool = True,
    ) -> None:
        self.block_size = block_size
        self.hash_tokens = hash_tokens
        self.events = event_sink or NullEventSink()
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.cached: dict[int, int] = {}
        self.free_uncached: deque[int] = deque(range(num_blocks))
        self.free_cached: OrderedDict[int, None] = OrderedDict()

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_uncached) + len(self.free_cached)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # Admission and growth.

    def prefix_hits(self, seq: Sequence) -> list[int]:
        """Cached physical blocks matching the start of `seq`. The block holding
        the last token never counts: its logits must be computed."""
        if not self.enable_prefix_caching:
            return []
        usable = (seq.num_tokens - 1) // self.block_size
        if usable == 0:
            return []
        hashes = self.hash_tokens(seq.token_ids[: usable * self.block_size])
        hits = []
        for index, block_hash in enumerate(hashes):
            block_id = self.cached.get(block_hash)
            start = index * self.block_size
            # A 64-bit hash match is checked against the tokens before it is trusted.
            if (
                block_id is None
                or self.blocks[block_id].token_ids != seq.token_ids[start : start + self.block_size]
            ):
                break
            hits.append(block_id)
        return hits

    def can_admit(self, hits: list[int], num_tokens: int) -> bool:
        """Whether a waiting sequence with these prefix hits can hold `num_tokens`."""
        # Hits on free cached blocks take those blocks out of the free pool.
        hits_on_free = sum(1 for block_id in hits if self.blocks[block_id].ref_count == 0)
        needed = self.blocks_for(num_tokens) - len(hits)
        return needed <= self.num_free_blocks - hits_on_free

    def admit(self, seq: Sequence, hits: list[int]) -> None:
        for block_id in hits:
            self._acquire(block_id)
        seq.block_table = list(hits)
        seq.block_hashes = [self.blocks[block_id].hash for block_id in hits]
        seq.num_computed_tokens = len(hits) * self.block_size

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        return max(0, self.blocks_for(num_tokens) - len(seq.block_table))

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Gives `seq` room for `num_tokens` tokens; the caller checked there is."""
        needed = self.blocks_needed(seq, num_tokens)
        if needed > self.num_free_blocks:
            raise RuntimeError(f"need {needed} blocks, {self.num_free_blocks} free")
        seq.block_table.extend(self._take_free_block() for _ in range(needed))

    def free(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    # Prefix cache.

    def commit(self, seq: Sequence) -> None:
        """Registers the blocks `seq` has filled with computed tokens since the last call."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        first_new = len(seq.block_hashes)
        if num_full <= first_new:
            return
        hashes = self.hash_tokens(seq.token_ids[: num_full * self.block_size])
        pending = _PendingStored(seq.block_hashes[-1] if seq.block_hashes else None)
        for index in range(first_new, num_full):
            block_hash = hashes[index]
            start = index * self.block_size
            tokens = seq.token_ids[start : start + self.block_size]
            if self._register(seq.block_table[index], block_hash, tokens):
                pending.add(block_hash, tokens)
            else:
                # Another sequence cached the same block first; the router already
                # knows it, and the next stored event chains from it.
                pending.flush(self.events)
                pending = _PendingStored(block_hash)
            seq.block_hashes.append(block_hash)
        pending.flush(self.events)

    def register_imported(
        self, block_hashes: SequenceOf[int], token_ids: SequenceOf[list[int]], parent: int | None
    ) -> ImportReservation:
        """Takes a free block for each block hash not yet cached and registers it.

        The reservation lists (index into block_hashes, physical block) for the
        blocks whose data the caller must now copy in. Every block involved stays
        referenced until `release_import`, so filling one cannot evict another.
        """
        already = [self.cached.get(block_hash) for block_hash in block_hashes]
        needed = sum(1 for block_id in already if block_id is None)
        held_free = sum(
            1
            for block_id in already
            if block_id is not None and self.blocks[block_id].ref_count == 0
        )
        if needed > self.num_free_blocks - held_free:
            raise RuntimeError(f"cannot import {needed} blocks: {self.num_free_blocks} free")
        reservation = ImportReservation()
        for block_id in already:
            if block_id is not None:
                self._acquire(block_id)
                reservation.held.append(block_id)
        pending = _PendingStored(parent)
        for index, (block_hash, tokens) in enumerate(zip(block_hashes, token_ids, strict=True)):
            if already[index] is not None:
                pending.flush(self.events)
                pending = _PendingStored(block_hash)
                continue
            block_id = self._take_free_block()
            self._register(block_id, block_hash, list(tokens))
            pending.add(block_hash, list(tokens))
            reservation.placed.append((index, block_id))
            reservation.held.append(block_id)
        pending.flush(self.events)
        return reservation

    def release_import(self, reservation: ImportReservation) -> None:
        for block_id in reservation.held:
            self._release(block_id)

    def lookup(self, block_hashes: SequenceOf[int]) -> list[int]:
        """Physical blocks of the cached prefix of `block_hashes`."""
        found = []
        for block_hash in block_hashes:
            block_id = self.cached.get(block_hash)
            if block_id is None:
                break
            found.append(block_id)
        return found

    def pin(self, block_hashes: SequenceOf[int]) -> list[int]:
        """Holds the cached prefix of `block_hashes` against eviction; returns the
        hashes pinned. Each pin needs one `unpin`."""
        pinned = []
        for block_id in self.lookup(block_hashes):
            self._acquire(block_id)
            pinned.append(self.blocks[block_id].hash)
        return pinned

    def unpin(self, block_hashes: SequenceOf[int]) -> None:
        for block_hash in block_hashes:
            block_id = self.cached.get(block_hash)
            if block_id is None or self.blocks[block_id].ref_count == 0:
                raise ValueError(f"block {block_hash} is not pinned")
            self._release(block_id)

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached block; refused (False) while any block is in use."""
        if self.num_free_blocks != self.num_blocks:
            return False
        for block_id in self.free_cached:
            self.blocks[block_id].hash = None
            self.blocks[block_id].token_ids = None
            self.free_uncached.append(block_id)
        self.free_cached.clear()
        self.cached.clear()
        self.events.cleared()
        return True

    # Internals.

    def _register(self, block_id: int, block_hash: int, tokens: list[int]) -> bool:
        if block_hash in self.cached:
            return False
        block = self.blocks[block_id]
        block.hash = block_hash
        block.token_ids = tokens
        self.cached[block_hash] = block_id
        return True

    def _acquire(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_cached[block_id]
        block.ref_count += 1

    def _take_free_block(self) -> int:
        if self.free_uncached:
            block_id = self.free_uncached.popleft()
        else:
            block_id, _ = self.free_cached.popitem(last=False)
            self._evict(self.blocks[block_id])
        self.blocks[block_id].ref_count = 1
        return block_id

    def _evict(self, block: Block) -> None:
        del self.cached[block.hash]
        self.events.removed([block.hash], Tier.DEVICE)
        block.hash = None
        block.token_ids = None

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count > 0:
            return
        if block.hash is not None and self.cached.get(block.hash) == block_id:
            self.free_cached[block_id] = None
        else:
            block.hash = None
            block.token_ids = None
            self.free_uncached.append(block_id)


class _PendingStored:
    """Consecutive newly cached blocks of one sequence, sent as one stored event."""

    def __init__(self, parent: int | None) -> None:
        self.parent = parent
        self.block_ids: list[int] = []
        self.token_ids: list[int] = []

    def add(self, block_hash: int, tokens: list[int]) -> None:
        self.block_ids.append(block_hash)
        self.token_ids.extend(tokens)

    def flush(self, events: EventSink) -> None:
        if self.block_ids:
            events.stored(self.parent, self.block_ids, self.token_ids, Tier.DEVICE)
        self.block_ids = []
        self.token_ids = []
