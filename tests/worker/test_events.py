"""The worker's event sink: events held until the publisher is attached,
and a resync dump that rebuilds the same router index as the events did."""

from __future__ import annotations

from kvrouter._core import PrefixIndex
from kvrouter.engine import EngineConfig, LLMEngine, SamplingParams
from kvrouter.events import EventList, Removed, Stored, Tier
from kvrouter.events.core import core_events
from kvrouter.worker.events import MirroredEventSink

from .helpers import BLOCK, prompt


def _index(events) -> PrefixIndex:
    index = PrefixIndex(BLOCK)
    index.apply(1, 0, core_events(events))
    return index


def test_held_events_reach_the_publisher_in_order():
    sink = MirroredEventSink(BLOCK)
    sink.stored(None, [1], list(range(BLOCK)), Tier.DEVICE)
    sink.removed([1], Tier.DEVICE)
    recorder = EventList()
    sink.attach(recorder)
    sink.cleared()
    assert [type(e).__name__ for e in recorder.events] == ["Stored", "Removed", "Cleared"]


def test_dump_rebuilds_the_index_the_events_built(tiny_model):
    sink = MirroredEventSink(BLOCK)
    recorder = EventList()
    sink.attach(recorder)
    # A small cache, so that eviction (removed events) happens too.
    engine = LLMEngine(EngineConfig(model=str(tiny_model), num_kv_blocks=24), event_sink=sink)
    shared = prompt(1, 64)
    prompts = [shared + prompt(i, 40 + 13 * i) for i in range(2, 8)]
    for tokens in prompts:
        engine.generate([tokens], SamplingParams(max_tokens=20, ignore_eos=True))
    assert any(isinstance(e, Removed) for e in recorder.events)

    dump = EventList()
    sink.dump(dump)
    from_events, from_dump = _index(recorder.events), _index(dump.events)
    assert from_events.stats()["blocks"] == from_dump.stats()["blocks"] == sink.num_blocks
    for tokens in prompts:
        assert (
            from_events.find_matches_for_tokens(tokens).scores
            == from_dump.find_matches_for_tokens(tokens).scores
        )


def test_the_dump_keeps_each_blocks_tier_and_namespace():
    sink = MirroredEventSink(BLOCK, namespace="model-a")
    sink.stored(None, [1, 2], list(range(2 * BLOCK)))
    sink.stored(2, [3], list(range(BLOCK)), "host", namespace="lora-b")
    dump = EventList()
    sink.dump(dump)
    assert [(e.block_ids, e.parent, e.tier, e.namespace) for e in dump.events] == [
        ((1,), None, Tier.DEVICE, "model-a"),
        ((2,), 1, Tier.DEVICE, "model-a"),
        ((3,), 2, Tier.HOST, "lora-b"),
    ]
    assert all(isinstance(e, Stored) for e in dump.events)
