"""The local index as a batch sink."""

from __future__ import annotations

from kvrouter import PrefixIndex
from kvrouter.adapters.sink import apply_batch
from kvrouter.events import Stored, WorkerBatch

from .engine_hashes import BS, prompt


def test_a_batch_with_an_event_the_core_refuses_clears_the_worker():
    index = PrefixIndex(BS)
    assert apply_batch(index, WorkerBatch(1, 0, [Stored([1], prompt(1, 1))])) == "applied"
    # Three tokens for two blocks: refused when converted, before the index sees it.
    apply_batch(index, WorkerBatch(1, 1, [Stored([2, 3], [1, 2, 3], parent=1)]))
    assert index.workers() == {1: (0, 2)}
