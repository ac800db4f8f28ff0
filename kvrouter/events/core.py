"""The one conversion from the event model to the core's index events."""

from __future__ import annotations

from collections.abc import Iterable

from kvrouter import _core
from kvrouter.events.model import Cleared, EndsReusable, Event, Removed, Stored


def core_events(events: Iterable[Event]) -> list[_core.Event]:
    """The events as the index's `Stored`, `Removed`, `EndsReusable` and
    `Cleared`. Raises
    ValueError, naming the event, for one the core refuses (no blocks,
    tokens that are not whole blocks, both or neither of tokens and local
    hashes)."""
    out: list[_core.Event] = []
    for i, event in enumerate(events):
        try:
            out.append(_core_event(event))
        except (ValueError, TypeError, OverflowError) as e:
            raise ValueError(f"event {i}: {e}") from None
    return out


def _core_event(event: Event) -> _core.Event:
    match event:
        case Stored(local_hashes=()):
            return _core.Stored(
                event.block_ids,
                event.token_ids,
                parent=event.parent,
                tier=event.tier,
                namespace=event.namespace,
            )
        case Stored():
            # Tokens as well are the core's "exactly one of" error.
            return _core.Stored(
                event.block_ids,
                event.token_ids or None,
                local_hashes=event.local_hashes,
                parent=event.parent,
                tier=event.tier,
                namespace=event.namespace,
            )
        case Removed():
            return _core.Removed(event.block_ids, event.tier)
        case EndsReusable():
            return _core.EndsReusable(event.block_ids, event.reusable)
        case Cleared():
            return _core.Cleared()
    raise TypeError(f"{type(event).__name__} is not a KV event")
