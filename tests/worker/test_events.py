"""The worker's event sink: events held until the publisher is attached,
and a resync dump that rebuilds the same router index as the events did."""

from __future__ import annotations

from kvrouter._core import Cleared, PrefixIndex, Removed, Stored
from kvrouter.engine import EngineConfig, LLMEngine, SamplingParams
from kvrouter.worker.events import MirroredEventSink

from .helpers import BLOCK, prompt


class Recorder:
    """Keeps sink calls as the index's events."""

    def __init__(self) -> None:
        self.events = []

    def stored(self, parent, block_ids, token_ids, tier):
        self.events.append(Stored(list(block_ids), list(token_ids), parent=parent))

    def removed(self, block_ids, tier):
        self.events.append(Removed(list(block_ids)))

    def cleared(self):
        self.events.append(Cleared())


def _index(events) -> PrefixIndex:
    index = PrefixIndex(BLOCK)
    index.apply(1, 0, events)
    return index


def test_held_events_reach_the_publisher_in_order():
    sink = MirroredEventSink(BLOCK)
    sink.stored(None, [1], list(range(BLOCK)), "device")
    sink.removed([1], "device")
    recorder = Recorder()
    sink.attach(recorder)
    sink.cleared()
    assert [type(e).__name__ for e in recorder.events] == ["Stored", "Removed", "Cleared"]


def test_dump_rebuilds_the_index_the_events_built(tiny_model):
    sink = MirroredEventSink(BLOCK)
    recorder = Recorder()
    sink.attach(recorder)
    # A small cache, so that eviction (removed events) happens too.
    engine = LLMEngine(EngineConfig(model=str(tiny_model), num_kv_blocks=24), event_sink=sink)
    shared = prompt(1, 64)
    prompts = [shared + prompt(i, 40 + 13 * i) for i in range(2, 8)]
    for tokens in prompts:
        engine.generate([tokens], SamplingParams(max_tokens=20, ignore_eos=True))
    assert any(isinstance(e, Removed) for e in recorder.events)

    dump = Recorder()
    sink.dump(dump)
    from_events, from_dump = _index(recorder.events), _index(dump.events)
    assert from_events.stats()["blocks"] == from_dump.stats()["blocks"] == sink.num_blocks
    for tokens in prompts:
        assert (
            from_events.find_matches_for_tokens(tokens).scores
            == from_dump.find_matches_for_tokens(tokens).scores
        )
