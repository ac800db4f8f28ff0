"""The event model: frozen values, the sink calls that build them, and the
one conversion to the core's events."""

from __future__ import annotations

import dataclasses

import pytest

from kvrouter import PrefixIndex, local_block_hashes
from kvrouter.events import (
    Cleared,
    EndsReusable,
    EventList,
    Removed,
    Stored,
    Tier,
    WorkerBatch,
)
from kvrouter.events.core import core_events

BLOCK = 16


def test_events_are_frozen_values_whatever_sequences_built_them():
    stored = Stored([1, 2], range(2 * BLOCK), parent=9)
    assert stored == Stored((1, 2), tuple(range(2 * BLOCK)), parent=9)
    assert hash(stored) == hash(Stored((1, 2), list(range(2 * BLOCK)), parent=9))
    with pytest.raises(dataclasses.FrozenInstanceError):
        stored.parent = 3
    # The cut time is not part of a batch's value.
    assert WorkerBatch(1, 0, [Cleared()], emitted_at=1.0) == WorkerBatch(1, 0, (Cleared(),))


def test_sink_calls_build_the_events_with_the_sinks_namespace():
    sink = EventList(namespace="model")
    sink.stored(None, [1], range(BLOCK))
    sink.stored(1, [2], range(BLOCK), "disk", namespace="lora")
    sink.removed([1])
    sink.cleared()
    assert sink.events == [
        Stored([1], range(BLOCK), namespace="model"),
        Stored([2], range(BLOCK), parent=1, tier=Tier.DISK, namespace="lora"),
        Removed([1], Tier.DEVICE),
        Cleared(),
    ]


def test_events_with_tokens_or_local_hashes_reach_the_index_alike():
    tokens = list(range(2 * BLOCK))
    by_tokens, by_hashes = PrefixIndex(BLOCK), PrefixIndex(BLOCK)
    by_tokens.apply(1, 0, core_events([Stored([1, 2], tokens)]))
    by_hashes.apply(1, 0, core_events([Stored([1, 2], local_hashes=local_block_hashes(tokens))]))
    assert by_tokens.find_matches_for_tokens(tokens).scores == {1: 2}
    assert by_hashes.find_matches_for_tokens(tokens).scores == {1: 2}


def test_a_prefix_is_reused_only_as_far_as_its_deepest_reusable_end():
    tokens = list(range(4 * BLOCK))
    index = PrefixIndex(BLOCK)
    index.apply(1, 0, core_events([Stored([1, 2, 3, 4], tokens)]))
    index.apply(1, 1, core_events([EndsReusable([3, 4], reusable=False)]))
    assert index.find_matches_for_tokens(tokens).scores == {1: 2}
    index.apply(1, 2, core_events([EndsReusable([4], reusable=True)]))
    assert index.find_matches_for_tokens(tokens).scores == {1: 4}
    assert index.find_matches_for_tokens(tokens[: 3 * BLOCK]).scores == {1: 2}
    index.apply(1, 3, core_events([EndsReusable([1, 2, 3], reusable=False)]))
    assert index.find_matches_for_tokens(tokens[: 3 * BLOCK]).scores == {}


def test_an_event_the_core_refuses_is_named():
    with pytest.raises(ValueError, match="event 1: .*3 tokens for 2 blocks"):
        core_events([Cleared(), Stored([1, 2], range(3))])
    with pytest.raises(ValueError, match="event 0: .*exactly one"):
        core_events([Stored([1], range(BLOCK), local_hashes=[5])])
