"""The engine's event-sink interface, collecting KV events as protobufs."""

from __future__ import annotations

from collections.abc import Iterable

from kvrouter.client.convert import TIER_VALUES
from kvrouter.proto_gen import router_pb2 as pb


def _tier(tier) -> int:
    name = getattr(tier, "name", tier)
    value = TIER_VALUES.get(str(name).lower())
    if value is None:
        raise ValueError(f"unknown tier {tier!r}; expected 'device', 'host' or 'disk'")
    return value


class EventCollector:
    """An event sink that keeps protobuf events (what `dump_cache` fills)."""

    def __init__(self, namespace: str = "") -> None:
        self.namespace = namespace
        self.events: list[pb.KvEvent] = []

    def stored(
        self,
        parent_block_id: int | None,
        block_ids: Iterable[int],
        token_ids: Iterable[int],
        tier="device",
        namespace: str | None = None,
    ) -> None:
        stored = pb.StoredEvent(
            block_ids=block_ids,
            token_ids=token_ids,
            tier=_tier(tier),
            namespace=self.namespace if namespace is None else namespace,
        )
        if parent_block_id is not None:
            stored.parent_block_id = parent_block_id
        self.events.append(pb.KvEvent(stored=stored))

    def removed(self, block_ids: Iterable[int], tier="device") -> None:
        self.events.append(
            pb.KvEvent(removed=pb.RemovedEvent(block_ids=block_ids, tier=_tier(tier)))
        )

    def cleared(self) -> None:
        self.events.append(pb.KvEvent(cleared=pb.ClearedEvent()))
