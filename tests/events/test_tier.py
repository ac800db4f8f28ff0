"""The one tier type: parsed from names at the edge, and the same tier after
protobuf and the index."""

from __future__ import annotations

import pytest

import kvrouter
from kvrouter import PrefixIndex
from kvrouter.events import Removed, Stored, Tier, WorkerBatch
from kvrouter.events.core import core_events
from kvrouter.events.proto import batch_to_proto, events_from_proto
from kvrouter.proto_gen import router_pb2 as pb

BLOCK = 16
TOKENS = list(range(BLOCK))


def test_names_parse_to_the_tier_in_any_case():
    assert kvrouter.Tier is Tier
    for tier in Tier:
        assert Tier.parse(tier.value.upper()) is Tier.parse(tier) is tier
    assert Stored([1], TOKENS, tier="HOST").tier is Tier.HOST
    with pytest.raises(ValueError, match="unknown tier 'gpu'"):
        Removed([1], "gpu")


@pytest.mark.parametrize("tier", list(Tier))
def test_a_tier_round_trips_through_protobuf_and_into_the_index(tier):
    batch = WorkerBatch(1, 0, [Stored([1], TOKENS, tier=tier), Removed([2], tier)])
    message = batch_to_proto(batch)
    assert message.events[0].stored.tier == pb.Tier.Value(f"TIER_{tier.name}")
    assert WorkerBatch(1, 0, events_from_proto(message.events)) == batch

    index = PrefixIndex(BLOCK)
    index.apply(1, 0, core_events(batch.events[:1]))
    assert index.find_matches_for_tokens(TOKENS).tiers == {1: tuple(int(t is tier) for t in Tier)}


def test_an_unknown_protobuf_tier_names_its_event():
    events = [pb.KvEvent(cleared=pb.ClearedEvent()), pb.KvEvent(removed=pb.RemovedEvent(tier=7))]
    with pytest.raises(ValueError, match="event 1: unknown tier 7"):
        events_from_proto(events)
