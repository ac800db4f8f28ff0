"""Lost batches, engine restarts and unreadable payloads on the ZMQ path."""

from __future__ import annotations

import pytest

from kvrouter import PrefixIndex
from kvrouter.adapters.sink import IndexSink, next_seq_of
from kvrouter.adapters.vllm import EngineSubscriber

from . import vllm_schema as vs
from .conftest import until
from .engine_hashes import BS, EngineHasher, prompt
from .test_vllm_events import delivered, run


def store(hasher, tokens, encoding="positional"):
    return vs.stored(encoding, hasher.hashes(tokens), tokens)


def held(index, tokens):
    return index.find_matches_for_tokens(tokens).scores


@pytest.mark.parametrize("encoding", ["positional", "map"])
def test_a_gap_is_repaired_from_the_replay_socket(farm, encoding):
    engine, (pub,) = farm.start("a", encoding)
    hasher = EngineHasher(as_bytes=encoding == "map")
    turns = [prompt(i, 2) for i in range(5)]

    async def scenario():
        index = PrefixIndex(BS)
        async with EngineSubscriber([engine], IndexSink(index), block_size=BS) as sub:
            worker = engine.worker_ids[0]
            for turn in turns[:2]:
                seq = pub.publish([store(hasher, turn, encoding)])
            await delivered(index, worker, seq)
            pub.publish([store(hasher, turns[2], encoding)], lost=True)
            pub.publish([vs.removed(encoding, hasher.hashes(turns[0]))], lost=True)
            pub.publish([store(hasher, turns[3], encoding)], lost=True)
            seq = pub.publish([store(hasher, turns[4], encoding)])
            await delivered(index, worker, seq)
            assert sub.stats["resyncs"] == 0
            assert sub.stats["replays"] >= 1
            assert held(index, turns[0]) == {}
            for turn in turns[1:]:
                assert held(index, turn) == {worker: 2}

    run(scenario())


def test_a_gap_beyond_the_replay_buffer_resyncs_the_worker(farm):
    engine, (pub,) = farm.start("a", "positional", buffer_steps=2)
    hasher = EngineHasher(as_bytes=False)
    kept, lost, evicted, after = prompt(1, 2), prompt(2, 2), prompt(3, 2), prompt(4, 2)

    async def scenario():
        index = PrefixIndex(BS)
        async with EngineSubscriber([engine], IndexSink(index), block_size=BS) as sub:
            worker = engine.worker_ids[0]
            pub.publish([store(hasher, kept)])
            seq = pub.publish([store(hasher, evicted)])
            await delivered(index, worker, seq)
            pub.publish([store(hasher, lost)], lost=True)
            pub.publish([vs.removed("positional", hasher.hashes(evicted))], lost=True)
            seq = pub.publish([store(hasher, after)])
            await delivered(index, worker, seq)
            assert sub.stats["resyncs"] == 1
            # The removal was lost with the batches before it: the worker
            # restarts from what the buffer still held, so the evicted
            # blocks are never served as cached.
            assert held(index, evicted) == {}
            assert held(index, after) == {worker: 2}

    run(scenario())


def test_without_a_replay_socket_a_gap_resyncs(farm):
    engine, (pub,) = farm.start("a", "map", replay=False)
    hasher = EngineHasher(as_bytes=True)
    first, evicted, after = prompt(1, 2), prompt(2, 2), prompt(3, 2)

    async def scenario():
        index = PrefixIndex(BS)
        async with EngineSubscriber([engine], IndexSink(index), block_size=BS) as sub:
            worker = engine.worker_ids[0]
            # Without replay only what arrives live counts; wait until the
            # subscription carries messages.
            await until(
                lambda: (pub.publish([]), next_seq_of(index, worker) > 0)[1], "the subscription"
            )
            seq = pub.publish([store(hasher, evicted, "map")])
            await delivered(index, worker, seq)
            pub.publish([vs.removed("map", hasher.hashes(evicted))], lost=True)
            seq = pub.publish([store(hasher, after, "map")])
            await delivered(index, worker, seq)
            assert sub.stats["resyncs"] >= 1
            assert held(index, evicted) == {}
            assert held(index, after) == {worker: 2}
            assert held(index, first) == {}

    run(scenario())


def test_an_engine_restart_resyncs_its_worker(farm):
    engine, (pub,) = farm.start("a", "positional")
    hasher = EngineHasher(as_bytes=False)
    before, after = prompt(1, 3), prompt(2, 2)

    async def scenario():
        index = PrefixIndex(BS)
        async with EngineSubscriber([engine], IndexSink(index), block_size=BS) as sub:
            worker = engine.worker_ids[0]
            for _ in range(3):
                pub.publish([])
            seq = pub.publish([store(hasher, before)])
            await delivered(index, worker, seq)
            restarted = farm.restart(pub)
            restarted.publish([store(hasher, after)])
            await until(lambda: held(index, after) == {worker: 2}, "the restarted engine")
            assert held(index, before) == {}
            assert sub.stats["restarts"] >= 1

    run(scenario())


def test_an_unreadable_batch_clears_the_worker_and_the_stream_goes_on(farm):
    engine, (pub,) = farm.start("a", "map")
    hasher = EngineHasher(as_bytes=True)
    before, after = prompt(1, 2), prompt(2, 2)

    async def scenario():
        index = PrefixIndex(BS)
        async with EngineSubscriber([engine], IndexSink(index), block_size=BS) as sub:
            worker = engine.worker_ids[0]
            seq = pub.publish([store(hasher, before, "map")])
            await delivered(index, worker, seq)
            pub.publish_raw(b"\xc1 not msgpack")
            seq = pub.publish([store(hasher, after, "map")])
            await delivered(index, worker, seq)
            assert sub.stats["malformed"] == 1
            assert held(index, before) == {}
            assert held(index, after) == {worker: 2}

    run(scenario())
