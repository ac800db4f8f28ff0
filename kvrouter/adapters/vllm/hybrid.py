"""Hybrid engines: KV cache groups of full attention beside groups of a
sliding window, of mamba states (or of chunked local attention), each
holding its own copy of a block under the same hash.

vLLM reuses L blocks of a hybrid prefix when every full-attention group
holds all L, every sliding-window group of window w tokens holds the
n = ceil((w - 1) / block_size) blocks before L (all L, when L < n), and
every mamba group holds the state saved at block L; it reuses the largest
such L (the fixed point its hybrid coordinator reaches by asking each group
in turn). A mamba group is so a window of one block, whose events name only
the blocks a state was saved at (in vLLM's "align" mode, where a chunk of
the prefill ended on a block boundary). The router follows that rule
exactly:

- a block is indexed (Stored) once every full-attention group holds it and
  its parent is indexed, and leaves the index (Removed, with the blocks
  after it) when one of them drops it;
- an indexed block whose window a window group lacks is marked as no
  reusable end (EndsReusable), so the index counts a prefix only as far as
  its deepest block whose window every such group holds.

A chunked local attention group of chunks of c tokens needs the blocks of
L's last chunk before L (none when L ends a chunk). vLLM's events do not
carry c: the engine's config names it (`attention_chunk_size`), and
without it, as for a window group whose events name no window, the group
is held to the full-attention rule (every block of the prefix), which can
count less than vLLM reuses, never more. An engine of window groups only
indexes every block a group holds, and those that lead to one.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvrouter.events import EndsReusable, Event, Removed, Stored, Tier

# Group kinds whose reuse holding a whole prefix guarantees.
FULL_KINDS = (None, "full_attention", "mla_attention")
SLIDING_KINDS = ("sliding_window", "sliding_window_mla")
# Groups whose events name the blocks a state was saved at, not their tokens.
STATE_KINDS = ("mamba",)
CHUNKED_KINDS = ("chunked_local_attention",)
WINDOW_KINDS = (*SLIDING_KINDS, *STATE_KINDS, *CHUNKED_KINDS)


@dataclass(frozen=True)
class EndRule:
    """What a group must hold before the end of a reused prefix of L blocks:
    the `window` blocks before it (all L when fewer); or, with chunks of
    `chunk_tokens`, the blocks of L's last chunk; neither: all L."""

    window: int | None = None
    chunk_tokens: int | None = None
    block_size: int = field(default=1, compare=False)

    @property
    def whole(self) -> bool:
        return self.window is None and self.chunk_tokens is None

    @property
    def span(self) -> int:
        """How many blocks after a block its holding decides an end for."""
        if self.window is not None:
            return self.window
        return -(-(self.chunk_tokens or 0) // self.block_size)

    def needed(self, length: int) -> int:
        if self.window is not None:
            return self.window
        chunk_start = length * self.block_size // self.chunk_tokens * self.chunk_tokens
        return length - chunk_start // self.block_size


WHOLE = EndRule()


def end_rule(
    kind: str | None, sliding_window: int | None, block_size: int, chunk_tokens: int = 0
) -> EndRule:
    """A group's EndRule, from its events' kind and window, and the engine's
    chunk size (0: not known)."""
    if kind in STATE_KINDS:
        return EndRule(window=1)
    if kind in SLIDING_KINDS and sliding_window is not None:
        return EndRule(window=-(-(sliding_window - 1) // block_size))
    if kind in CHUNKED_KINDS and chunk_tokens:
        return EndRule(chunk_tokens=chunk_tokens, block_size=block_size)
    return WHOLE


@dataclass
class _Block:
    parent: int | None
    tokens: list[int]
    namespace: str


class HybridBlocks:
    """One worker's blocks per group, and what of them the index holds."""

    def __init__(self) -> None:
        self.groups: dict[int, set[int]] = {}
        # What each group that does not need a whole prefix needs before an end.
        self.windows: dict[int, EndRule] = {}
        # Blocks a group holds, and those before them while one is known.
        self.blocks: dict[int, _Block] = {}
        self.children: dict[int | None, set[int]] = {}
        self.indexed: set[int] = set()
        # Indexed blocks marked as no reusable end.
        self.through: set[int] = set()

    def know(self, groups: dict[int, EndRule]) -> list[Event]:
        """The groups a batch stores in, each with its EndRule, before its
        events: what was indexed before a group was known is brought in
        line with it."""
        new = groups.keys() - self.groups.keys()
        for group in new:
            self.groups[group] = set()
            if not groups[group].whole:
                self.windows[group] = groups[group]
        return self._refresh(list(self.blocks)) if new else []

    def stored(self, group: int, runs: list[Stored]) -> list[Event]:
        """A group's blocks, as the converter made them (namespaced)."""
        out = self.know({group: WHOLE})
        held = self.groups[group]
        touched: list[int] = []
        for run in runs:
            size = len(run.token_ids) // len(run.block_ids)
            parent = run.parent
            for i, block in enumerate(run.block_ids):
                if block not in self.blocks:
                    tokens = list(run.token_ids[i * size : (i + 1) * size])
                    self.blocks[block] = _Block(parent, tokens, run.namespace)
                    self.children.setdefault(parent, set()).add(block)
                held.add(block)
                touched.append(block)
                parent = block
        return out + self._refresh(touched)

    def holds(self, group: int, blocks: list[int]) -> list[Event]:
        """Blocks a mamba group saved a state at, by id alone."""
        out = self.know({group: EndRule(window=1)})
        self.groups[group].update(blocks)
        return out + self._refresh(blocks)

    def removed(self, group: int, blocks: list[int]) -> list[Event]:
        held = self.groups.get(group, set())
        dropped = [b for b in blocks if b in held]
        held.difference_update(dropped)
        touched = list(dropped)
        for block in dropped:
            touched += self._forget_unused(block)
        return self._refresh(touched)

    def _forget_unused(self, block: int | None) -> list[int]:
        """Forgets `block` once no group holds it and no known block follows
        it, then its parent likewise; the blocks forgotten."""
        forgotten: list[int] = []
        while (
            block in self.blocks
            and not self.children.get(block)
            and not any(block in held for held in self.groups.values())
        ):
            parent = self.blocks.pop(block).parent
            siblings = self.children[parent]
            siblings.discard(block)
            if not siblings:
                del self.children[parent]
            forgotten.append(block)
            block = parent
        return forgotten

    def _refresh(self, starts: Iterable[int]) -> list[Event]:
        """The events that bring the index in line with the groups at
        `starts` and at the blocks after them that these decide: those whose
        parent entered or left the index, and those within a window below.

        Blocks are settled in order of depth, so a parent is settled before
        its children."""
        span = max((rule.span for rule in self.windows.values()), default=0)
        depth = _Depths(self.blocks)
        runs = {group: _HeldRuns(self.blocks, self.groups[group]) for group in self.windows}
        levels: dict[int, int] = {}
        heap: list[tuple[int, int]] = []

        def push(block: int, level: int) -> None:
            if block not in levels:
                heapq.heappush(heap, (depth(block), block))
            levels[block] = min(level, levels.get(block, level))

        for block in starts:
            push(block, 0)
        stored: list[Event] = []
        removed: list[int] = []
        ends: dict[bool, list[int]] = {True: [], False: []}
        while heap:
            _, block = heapq.heappop(heap)
            was = block in self.indexed
            now = self._indexable(block)
            if now and not was:
                self.indexed.add(block)
                found = self.blocks[block]
                stored.append(
                    Stored(
                        [block],
                        found.tokens,
                        parent=found.parent,
                        tier=Tier.DEVICE,
                        namespace=found.namespace,
                    )
                )
            elif was and not now:
                self.indexed.discard(block)
                self.through.discard(block)
                removed.append(block)
            length = depth(block) + 1
            held = now and all(
                runs[group](block) >= min(rule.needed(length), length)
                for group, rule in self.windows.items()
            )
            if now and (through := not held) != (block in self.through):
                (self.through.add if through else self.through.discard)(block)
                ends[not through].append(block)
            level = levels[block] + 1
            if now != was or (now and level < span):
                for child in self.children.get(block, ()):
                    push(child, level)
        out = stored
        if removed:
            out.append(Removed(removed, Tier.DEVICE))
        out += [EndsReusable(blocks, reusable) for reusable, blocks in ends.items() if blocks]
        return out

    def _indexable(self, block: int) -> bool:
        found = self.blocks.get(block)
        return (
            found is not None
            and all(block in held for g, held in self.groups.items() if g not in self.windows)
            and (found.parent is None or found.parent in self.indexed)
        )


class _HeldRuns:
    """How many blocks in a row, back from a block, a group holds, memoized."""

    def __init__(self, blocks: dict[int, _Block], held: set[int]) -> None:
        self.blocks = blocks
        self.held = held
        self.known: dict[int, int] = {}

    def __call__(self, block: int) -> int:
        chain: list[int] = []
        at: int | None = block
        while at in self.held and at not in self.known:
            chain.append(at)
            at = self.blocks[at].parent if at in self.blocks else None
        run = self.known.get(at, 0) if at is not None else 0
        for b in reversed(chain):
            run += 1
            self.known[b] = run
        return self.known.get(block, 0)


class _Depths:
    """Each known block's distance from the first block of its known chain,
    memoized."""

    def __init__(self, blocks: dict[int, _Block]) -> None:
        self.blocks = blocks
        self.known: dict[int, int] = {}

    def __call__(self, block: int) -> int:
        chain: list[int] = []
        at: int | None = block
        while at in self.blocks and at not in self.known:
            chain.append(at)
            at = self.blocks[at].parent
        base = self.known.get(at, -1) if at is not None else -1
        for i, b in enumerate(reversed(chain)):
            self.known[b] = base + 1 + i
        return self.known.get(block, 0)
