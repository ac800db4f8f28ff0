"""The event-sink interface: where an engine reports cache changes.

Engines call `stored`, `removed` and `cleared`; code that forwards events
already made (a vLLM batch, held events, a dump) hands them over with
`emit`. A sink implements `emit`; the three calls build the events for it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

from kvrouter.events.model import Cleared, Event, Removed, Stored
from kvrouter.events.tier import Tier


class EventSink(ABC):
    # The namespace of stored blocks whose call names none.
    namespace: str = ""

    @abstractmethod
    def emit(self, events: Iterable[Event]) -> None:
        """Takes these events, in order. Thread-safe where the sink says so."""

    def stored(
        self,
        parent_block_id: int | None,
        block_ids: Iterable[int],
        token_ids: Iterable[int],
        tier: Tier | str = Tier.DEVICE,
        namespace: str | None = None,
    ) -> None:
        """Consecutive blocks of one sequence (block_size tokens each), after
        `parent_block_id` (None: they start it), were cached in `tier`."""
        self.emit(
            (
                Stored(
                    tuple(block_ids),
                    tuple(token_ids),
                    parent=parent_block_id,
                    tier=tier,
                    namespace=self.namespace if namespace is None else namespace,
                ),
            )
        )

    def removed(self, block_ids: Iterable[int], tier: Tier | str = Tier.DEVICE) -> None:
        """These blocks left `tier`."""
        self.emit((Removed(tuple(block_ids), tier),))

    def cleared(self) -> None:
        """The whole cache was dropped."""
        self.emit((Cleared(),))


class NullEventSink(EventSink):
    def emit(self, events: Iterable[Event]) -> None:
        pass


class EventList(EventSink):
    """Keeps the events it is given (what `dump_cache` fills, for instance)."""

    def __init__(self, namespace: str = "") -> None:
        self.namespace = namespace
        self.events: list[Event] = []

    def emit(self, events: Iterable[Event]) -> None:
        self.events.extend(events)
