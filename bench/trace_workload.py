"""KV events from a Mooncake-format trace: per-worker LRU caches fed the trace's requests.

A Mooncake trace line names a request's prompt by `hash_ids`, one per `unit` tokens
(512), where equal ids at equal positions mean an equal prefix. Each unit is expanded
into unit/16 blocks of 16 tokens. Requests go to the worker holding the longest cached
prefix (ties and a `spill` share of requests: the next worker in turn), and each
worker is an LRU cache of `capacity` blocks that evicts whole units, leaf first. A
request stores the blocks past its cached prefix in one event; the units it pushes
out are removed in one event.

`tile` repeats the trace with fresh ids, so an index can grow past the trace's own
distinct blocks.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import kvrouter

BLOCK_SIZE = 16
MOONCAKE_UNIT_TOKENS = 512
MIX = np.uint64(0x9E3779B97F4A7C15)


@dataclass
class TraceEvent:
    worker: int
    seq: int
    stored: bool
    # Block numbers (see TraceBlocks), in the event's order.
    blocks: np.ndarray
    parent: int = -1
    # The trace time of the request that caused it.
    timestamp_ms: int = 0


@dataclass
class TraceRequest:
    timestamp_ms: int
    blocks: np.ndarray


class TraceBlocks:
    """Every distinct block: its local hash, kvrouter sequence hash and an opaque id.

    Block numbers are unit * unit_blocks + position. A unit's sequence hashes chain
    from the unit that preceded it where it was first seen.
    """

    def __init__(self, unit_blocks: int, seed: int):
        self.unit_blocks = unit_blocks
        self.seed = np.uint64(seed)
        self._seq: dict[int, list[int]] = {}

    def local(self, blocks: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            x = (blocks.astype(np.uint64) + self.seed + np.uint64(1)) * MIX
            x ^= x >> np.uint64(31)
            x *= np.uint64(0xBF58476D1CE4E5B9)
            x ^= x >> np.uint64(29)
        return x

    def opaque(self, blocks: np.ndarray) -> np.ndarray:
        return self.local(blocks + np.uint64(1 << 40))

    def register(self, units: list[int]) -> None:
        """Chains each run of units not seen before in one call, from the unit before it."""
        parent = None
        i = 0
        while i < len(units):
            known = self._seq.get(units[i])
            if known is not None:
                parent = known[-1]
                i += 1
                continue
            end = i
            while (
                end < len(units) and units[end] not in self._seq and units[end] not in units[i:end]
            ):
                end += 1
            run = units[i:end]
            first = np.array(run, dtype=np.uint64)[:, None] * np.uint64(self.unit_blocks)
            numbers = (first + np.arange(self.unit_blocks, dtype=np.uint64)).ravel()
            chained = kvrouter.chain_hashes(self.local(numbers), parent)
            for k, unit in enumerate(run):
                self._seq[unit] = chained[k * self.unit_blocks : (k + 1) * self.unit_blocks]
            parent = chained[-1]
            i = end

    def seq(self, blocks: np.ndarray) -> np.ndarray:
        units, positions = np.divmod(blocks, self.unit_blocks)
        return np.array(
            [self._seq[int(u)][int(p)] for u, p in zip(units, positions, strict=True)],
            dtype=np.uint64,
        )


@dataclass
class TraceWorkload:
    blocks: TraceBlocks
    events: list[TraceEvent]
    requests: list[TraceRequest]
    workers: int
    capacity: int

    @property
    def blocks_stored(self) -> int:
        return sum(len(e.blocks) for e in self.events if e.stored)

    @property
    def blocks_removed(self) -> int:
        return sum(len(e.blocks) for e in self.events if not e.stored)


def read_trace(path: Path, limit: int | None = None) -> list[dict]:
    rows = []
    with path.open() as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
                if limit is not None and len(rows) >= limit:
                    break
    return rows


def build(
    rows: list[dict],
    *,
    workers: int,
    capacity: int,
    tile: int = 1,
    spill: float = 0.125,
    seed: int = 0,
    unit_tokens: int = MOONCAKE_UNIT_TOKENS,
) -> TraceWorkload:
    unit_blocks = unit_tokens // BLOCK_SIZE
    capacity_units = capacity // unit_blocks
    blocks = TraceBlocks(unit_blocks, seed)
    rng = np.random.default_rng(seed)
    caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(workers)]
    # Which workers cache each unit, so that routing does not visit every cache.
    holders: dict[int, set[int]] = {}
    next_seq = [0] * workers
    events: list[TraceEvent] = []
    requests: list[TraceRequest] = []
    span = 1 + max(h for r in rows for h in r["hash_ids"])
    turn = 0
    for copy in range(tile):
        offset_ms = copy * (rows[-1]["timestamp"] + 1)
        for row in rows:
            units = [h + copy * span for h in row["hash_ids"]]
            if not units:
                continue
            blocks.register(units)
            best, tied = _longest_cached(holders, units)
            if best == 0 or rng.random() < spill:
                worker = turn % workers
                turn += 1
                have = _cached_units(caches[worker], units)
            else:
                worker, have = min(tied), best
            cache = caches[worker]
            for unit in reversed(units):
                if unit not in cache:
                    holders.setdefault(unit, set()).add(worker)
                cache[unit] = None
                cache.move_to_end(unit)
            path = _unit_blocks(units, unit_blocks)
            now_ms = row["timestamp"] + offset_ms
            requests.append(TraceRequest(now_ms, path))
            if have < len(units):
                parent = int(path[have * unit_blocks - 1]) if have else -1
                stored = path[have * unit_blocks :]
                events.append(TraceEvent(worker, next_seq[worker], True, stored, parent, now_ms))
                next_seq[worker] += 1
            evicted = []
            while len(cache) > capacity_units:
                evicted.append(cache.popitem(last=False)[0])
                holders[evicted[-1]].discard(worker)
            if evicted:
                gone = _unit_blocks(evicted, unit_blocks)
                events.append(TraceEvent(worker, next_seq[worker], False, gone, -1, now_ms))
                next_seq[worker] += 1
    return TraceWorkload(blocks, events, requests, workers, capacity)


def _longest_cached(holders: dict[int, set[int]], units: list[int]) -> tuple[int, set[int]]:
    """The most leading units any worker caches, and the workers that cache that many."""
    best, tied = 0, set()
    for unit in units:
        level = holders.get(unit, set()) if best == 0 else tied & holders.get(unit, set())
        if not level:
            break
        best, tied = best + 1, level
    return best, tied


def _cached_units(cache: OrderedDict[int, None], units: list[int]) -> int:
    n = 0
    for unit in units:
        if unit not in cache:
            break
        n += 1
    return n


def _unit_blocks(units: list[int], unit_blocks: int) -> np.ndarray:
    starts = np.array(units, dtype=np.int64) * unit_blocks
    return (starts[:, None] + np.arange(unit_blocks)).ravel()
