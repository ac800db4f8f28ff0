"""Hybrid engines: KV cache groups of full attention and of a sliding
window (or chunked local attention) side by side, each holding its own
copy of a block under the same hash.

vLLM reuses a hybrid prefix only as far as every group holds what it needs:
the full-attention blocks of the whole prefix, a window group's blocks of
the window before its end. A block is therefore indexed once every group
holds it and its parent is indexed, and leaves the index when any group
drops it (with the blocks after it). The router then counts the longest
prefix that every group holds whole, which vLLM can always reuse: never
more than vLLM reuses, and less where a window group dropped blocks near
the start of a prefix whose end it still holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvrouter.events import Event, Removed, Stored, Tier

# Group kinds whose reuse holding a whole prefix guarantees.
FULL_KINDS = (None, "full_attention", "mla_attention")
WINDOW_KINDS = ("sliding_window", "sliding_window_mla", "chunked_local_attention")


@dataclass
class _Block:
    parent: int | None
    tokens: list[int]
    namespace: str


class HybridBlocks:
    """One worker's blocks per group, and which of them are indexed."""

    def __init__(self) -> None:
        self.groups: dict[int, set[int]] = {}
        self.blocks: dict[int, _Block] = {}
        self.children: dict[int, set[int]] = {}
        self.indexed: set[int] = set()

    def know(self, groups: set[int]) -> list[Event]:
        """The groups a batch stores in, before its events: a block of one
        is not indexed while another group of the batch is still to come."""
        new = groups - self.groups.keys()
        for group in new:
            self.groups[group] = set()
        # Blocks indexed before a group was known lack it.
        return self._drop(list(self.indexed)) if new else []

    def stored(self, group: int, runs: list[Stored]) -> list[Event]:
        """A group's blocks, as the converter made them (namespaced)."""
        out = self.know({group})
        held = self.groups[group]
        for run in runs:
            size = len(run.token_ids) // len(run.block_ids)
            parent = run.parent
            for i, block in enumerate(run.block_ids):
                if block not in self.blocks:
                    tokens = list(run.token_ids[i * size : (i + 1) * size])
                    self.blocks[block] = _Block(parent, tokens, run.namespace)
                    self.children.setdefault(parent, set()).add(block)
                held.add(block)
                out += self._index_from(block)
                parent = block
        return out

    def removed(self, group: int, blocks: list[int]) -> list[Event]:
        held = self.groups.get(group, set())
        out = self._drop([b for b in blocks if b in held])
        for block in blocks:
            held.discard(block)
            if block in self.blocks and not any(block in g for g in self.groups.values()):
                parent = self.blocks.pop(block).parent
                siblings = self.children.get(parent)
                if siblings is not None:
                    siblings.discard(block)
                    if not siblings:
                        del self.children[parent]
        return out

    def _indexable(self, block: int) -> bool:
        found = self.blocks.get(block)
        return (
            found is not None
            and all(block in held for held in self.groups.values())
            and (found.parent is None or found.parent in self.indexed)
        )

    def _index_from(self, block: int) -> list[Event]:
        """`block` and the blocks after it that can now be indexed."""
        out: list[Event] = []
        todo = [block]
        while todo:
            at = todo.pop()
            if at in self.indexed or not self._indexable(at):
                continue
            found = self.blocks[at]
            self.indexed.add(at)
            out.append(
                Stored(
                    [at],
                    found.tokens,
                    parent=found.parent,
                    tier=Tier.DEVICE,
                    namespace=found.namespace,
                )
            )
            todo.extend(self.children.get(at, ()))
        return out

    def _drop(self, blocks: list[int]) -> list[Event]:
        """Unindexes `blocks` and every indexed block after them."""
        gone: list[int] = []
        todo = [b for b in blocks if b in self.indexed]
        while todo:
            at = todo.pop()
            if at not in self.indexed:
                continue
            self.indexed.discard(at)
            gone.append(at)
            todo.extend(self.children.get(at, ()))
        return [Removed(gone, Tier.DEVICE)] if gone else []
