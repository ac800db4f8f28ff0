"""The worker's KV event sink. It forwards the engine's events to the
router's publisher and mirrors the cache they describe, so that a resync
can be answered with a full dump (the engine keeps no parent links).
Events emitted before the publisher is attached are held, then replayed."""

from __future__ import annotations

import threading
from collections import defaultdict, deque


class MirroredEventSink:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._lock = threading.Lock()
        # block id -> (parent block id, token ids, tier)
        self._blocks: dict[int, tuple[int | None, list[int], str]] = {}
        self._publisher = None
        self._held: list[tuple[str, tuple]] = []

    def attach(self, publisher) -> None:
        """Starts forwarding to `publisher` (a KvEventPublisher), after what was held."""
        with self._lock:
            for name, args in self._held:
                getattr(publisher, name)(*args)
            self._held = []
            self._publisher = publisher

    def stored(self, parent_block_id, block_ids, token_ids, tier) -> None:
        block_ids, token_ids = list(block_ids), list(token_ids)
        with self._lock:
            parent = parent_block_id
            for i, block_id in enumerate(block_ids):
                tokens = token_ids[i * self.block_size : (i + 1) * self.block_size]
                self._blocks[block_id] = (parent, tokens, tier)
                parent = block_id
            self._forward("stored", (parent_block_id, block_ids, token_ids, tier))

    def removed(self, block_ids, tier) -> None:
        block_ids = list(block_ids)
        with self._lock:
            for block_id in block_ids:
                self._blocks.pop(block_id, None)
            self._forward("removed", (block_ids, tier))

    def cleared(self) -> None:
        with self._lock:
            self._blocks.clear()
            self._forward("cleared", ())

    def dump(self, sink) -> None:
        """Replays the cache into `sink` as stored events, parents first. Blocks
        whose parent left the cache cannot be matched from a prompt's start,
        so they are left out."""
        with self._lock:
            children: dict[int | None, list[int]] = defaultdict(list)
            for block_id, (parent, _, _) in self._blocks.items():
                children[parent].append(block_id)
            pending = deque(children[None])
            while pending:
                block_id = pending.popleft()
                parent, tokens, tier = self._blocks[block_id]
                sink.stored(parent, [block_id], tokens, tier)
                pending.extend(children[block_id])

    @property
    def num_blocks(self) -> int:
        # Not __len__: an empty sink must stay truthy where `sink or default` is written.
        return len(self._blocks)

    def _forward(self, name: str, args: tuple) -> None:
        if self._publisher is None:
            self._held.append((name, args))
        else:
            getattr(self._publisher, name)(*args)
