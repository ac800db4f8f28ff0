"""The event model to and from the gRPC messages (`kvrouter.v1`)."""

from __future__ import annotations

from collections.abc import Iterable

from kvrouter.events.model import Cleared, EndsReusable, Event, Removed, Stored, WorkerBatch
from kvrouter.events.tier import Tier
from kvrouter.proto_gen import router_pb2 as pb

_TIER_VALUES = {Tier.DEVICE: pb.TIER_DEVICE, Tier.HOST: pb.TIER_HOST, Tier.DISK: pb.TIER_DISK}
_TIERS = {value: tier for tier, value in _TIER_VALUES.items()}


def batch_to_proto(batch: WorkerBatch) -> pb.EventBatch:
    return pb.EventBatch(
        seq=batch.seq,
        events=[_event_to_proto(e) for e in batch.events],
        resync=batch.resync,
        emitted_at=batch.emitted_at,
    )


def _event_to_proto(event: Event) -> pb.KvEvent:
    match event:
        case Stored():
            stored = pb.StoredEvent(
                block_ids=event.block_ids,
                token_ids=event.token_ids,
                local_hashes=event.local_hashes,
                tier=_TIER_VALUES[event.tier],
                namespace=event.namespace,
            )
            if event.parent is not None:
                stored.parent_block_id = event.parent
            return pb.KvEvent(stored=stored)
        case Removed():
            return pb.KvEvent(
                removed=pb.RemovedEvent(block_ids=event.block_ids, tier=_TIER_VALUES[event.tier])
            )
        case EndsReusable():
            return pb.KvEvent(
                ends_reusable=pb.EndsReusableEvent(
                    block_ids=event.block_ids, reusable=event.reusable
                )
            )
        case Cleared():
            return pb.KvEvent(cleared=pb.ClearedEvent())
    raise TypeError(f"{type(event).__name__} is not a KV event")


def events_from_proto(events: Iterable[pb.KvEvent]) -> list[Event]:
    """ValueError, naming the event, for an empty one or an unknown tier."""
    return [_event_from_proto(event, i) for i, event in enumerate(events)]


def _event_from_proto(event: pb.KvEvent, i: int) -> Event:
    # A slice reads a repeated field into a list much faster than iterating it.
    kind = event.WhichOneof("kind")
    if kind == "stored":
        s = event.stored
        return Stored(
            s.block_ids[:],
            s.token_ids[:],
            parent=s.parent_block_id if s.HasField("parent_block_id") else None,
            tier=_tier(s.tier, i),
            namespace=s.namespace,
            local_hashes=s.local_hashes[:],
        )
    if kind == "removed":
        return Removed(event.removed.block_ids[:], _tier(event.removed.tier, i))
    if kind == "ends_reusable":
        return EndsReusable(event.ends_reusable.block_ids[:], event.ends_reusable.reusable)
    if kind == "cleared":
        return Cleared()
    raise ValueError(f"event {i} is empty (no stored, removed, ends_reusable or cleared)")


def _tier(value: int, i: int) -> Tier:
    tier = _TIERS.get(value)
    if tier is None:
        raise ValueError(f"event {i}: unknown tier {value}")
    return tier
