"""The worker's KV event sink. It forwards the engine's events to the
router's publisher and mirrors the cache they describe, so that a resync
can be answered with a full dump (the engine keeps no parent links).
Events emitted before the publisher is attached are held, then replayed."""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from collections.abc import Iterable
from typing import NamedTuple

from kvrouter.events import Cleared, Event, EventSink, Removed, Stored, Tier


class _Block(NamedTuple):
    parent: int | None
    token_ids: tuple[int, ...]
    tier: Tier
    namespace: str


class MirroredEventSink(EventSink):
    def __init__(self, block_size: int, namespace: str = "") -> None:
        self.block_size = block_size
        self.namespace = namespace
        self._lock = threading.Lock()
        self._blocks: dict[int, _Block] = {}
        self._publishers: list[EventSink] = []
        self._held: list[Event] = []

    def attach(self, publisher: EventSink) -> None:
        """Starts forwarding to `publisher` too; the first attached gets
        what was held. (A worker in the engine-compatible mode that also
        joins a router publishes to both.)"""
        with self._lock:
            if not self._publishers:
                publisher.emit(self._held)
                self._held = []
            self._publishers.append(publisher)

    def emit(self, events: Iterable[Event]) -> None:
        events = list(events)
        with self._lock:
            for event in events:
                self._mirror(event)
            if not self._publishers:
                self._held.extend(events)
            for publisher in self._publishers:
                publisher.emit(events)

    def _mirror(self, event: Event) -> None:
        match event:
            case Stored():
                parent, size = event.parent, self.block_size
                for i, block_id in enumerate(event.block_ids):
                    tokens = event.token_ids[i * size : (i + 1) * size]
                    self._blocks[block_id] = _Block(parent, tokens, event.tier, event.namespace)
                    parent = block_id
            case Removed():
                for block_id in event.block_ids:
                    self._blocks.pop(block_id, None)
            case Cleared():
                self._blocks.clear()

    def dump(self, sink: EventSink) -> None:
        """Replays the cache into `sink` as stored events, parents first. Blocks
        whose parent left the cache cannot be matched from a prompt's start,
        so they are left out."""
        with self._lock:
            children: dict[int | None, list[int]] = defaultdict(list)
            for block_id, block in self._blocks.items():
                children[block.parent].append(block_id)
            pending = deque(children[None])
            while pending:
                block_id = pending.popleft()
                block = self._blocks[block_id]
                sink.stored(block.parent, [block_id], block.token_ids, block.tier, block.namespace)
                pending.extend(children[block_id])

    @property
    def num_blocks(self) -> int:
        # Not __len__: an empty sink must stay truthy where `sink or default` is written.
        return len(self._blocks)
