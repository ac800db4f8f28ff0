"""vLLM/SGLang KV events over real ZMQ sockets into the index and the router."""

from __future__ import annotations

import asyncio

import pytest

from kvrouter import PrefixIndex
from kvrouter.adapters.sink import IndexSink, next_seq_of
from kvrouter.adapters.vllm import EngineSubscriber, register_engines
from kvrouter.policy import Router

from . import vllm_schema as vs
from .conftest import until
from .engine_hashes import BS, EngineHasher, prompt


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def delivered(index, worker, seq):
    await until(lambda: next_seq_of(index, worker) > seq, f"worker {worker} batch {seq}")


@pytest.mark.parametrize("encoding", vs.ENCODINGS)
def test_stored_and_removed_blocks_land_in_the_index(farm, encoding):
    engine, (pub,) = farm.start("a", encoding)
    hasher = EngineHasher(as_bytes=encoding == "map")
    tokens = prompt(1, 4)
    ids = hasher.hashes(tokens)

    async def scenario():
        index = PrefixIndex(BS)
        async with EngineSubscriber([engine], IndexSink(index), block_size=BS):
            worker = engine.worker_ids[0]
            pub.publish([vs.stored(encoding, ids[:2], tokens[: 2 * BS])])
            pub.publish([vs.stored(encoding, ids[2:], tokens[2 * BS :], parent=ids[1])])
            await delivered(index, worker, 1)
            assert index.find_matches_for_tokens(tokens + [1, 2, 3]).scores == {worker: 4}
            seq = pub.publish([vs.removed(encoding, ids[3:])])
            await delivered(index, worker, seq)
            assert index.find_matches_for_tokens(tokens).scores == {worker: 3}
            seq = pub.publish([vs.cleared(encoding)])
            await delivered(index, worker, seq)
            assert index.find_matches_for_tokens(tokens).scores == {}

    run(scenario())


@pytest.mark.parametrize("encoding", ["positional", "map"])
def test_medium_becomes_the_tier(farm, encoding):
    engine, (pub,) = farm.start("a", encoding)
    hasher = EngineHasher(as_bytes=True)
    on_gpu, on_cpu, on_disk = prompt(1, 2), prompt(2, 3), prompt(3, 1)

    async def scenario():
        index = PrefixIndex(BS)
        async with EngineSubscriber([engine], IndexSink(index), block_size=BS):
            worker = engine.worker_ids[0]
            seq = pub.publish(
                [
                    vs.stored(encoding, hasher.hashes(on_gpu), on_gpu, medium="GPU"),
                    vs.stored(encoding, hasher.hashes(on_cpu), on_cpu, medium="CPU"),
                    vs.stored(encoding, hasher.hashes(on_disk), on_disk, medium="DISK"),
                    vs.stored(
                        encoding, hasher.hashes(prompt(4, 1)), prompt(4, 1), medium="SOMEWHERE_NEW"
                    ),
                ]
            )
            await delivered(index, worker, seq)
            assert index.find_matches_for_tokens(on_gpu).tiers == {worker: (2, 0, 0)}
            assert index.find_matches_for_tokens(on_cpu).tiers == {worker: (0, 3, 0)}
            assert index.find_matches_for_tokens(on_disk).tiers == {worker: (0, 0, 1)}
            # A medium the router cannot price is left out rather than guessed.
            assert index.find_matches_for_tokens(prompt(4, 1)).scores == {}

    run(scenario())


def test_lora_and_extra_keys(farm):
    engine, (pub,) = farm.start("a", "map")
    hasher = EngineHasher(as_bytes=True)
    adapter, salted = prompt(1, 2), prompt(2, 3)

    async def scenario():
        index = PrefixIndex(BS)
        async with EngineSubscriber([engine], IndexSink(index), block_size=BS):
            worker = engine.worker_ids[0]
            salted_ids = hasher.hashes(salted)
            seq = pub.publish(
                [
                    vs.stored(
                        "map",
                        hasher.hashes(adapter),
                        adapter,
                        lora_name="sql-lora",
                        extra_keys=[("sql-lora",), ("sql-lora",)],
                    ),
                    # A cache salt rides in the first block's extra keys only.
                    vs.stored("map", salted_ids, salted, extra_keys=[("tenant-7",), None, None]),
                ]
            )
            await delivered(index, worker, seq)
            assert index.find_matches_for_tokens(adapter).scores == {}
            assert index.find_matches_for_tokens(adapter, namespace="sql-lora").scores == {
                worker: 2
            }
            # Salted blocks never match a plain query of the same tokens.
            assert index.find_matches_for_tokens(salted).scores == {}
            assert index.workers()[worker][0] == 2 + 3

    run(scenario())


def test_routing_follows_the_engines_caches(farm):
    a, (pub_a,) = farm.start("a", "positional")
    b, (pub_b,) = farm.start("b", "map")
    hasher = EngineHasher(as_bytes=False)
    cached_on_a, cached_on_b = prompt(1, 8), prompt(2, 8)

    async def scenario():
        index = PrefixIndex(BS)
        router = Router(index)
        assert register_engines(router, [a, b]) == [a.worker_ids[0], b.worker_ids[0]]
        async with EngineSubscriber([a, b], IndexSink(index), block_size=BS):
            seq_a = pub_a.publish(
                [vs.stored("positional", hasher.hashes(cached_on_a), cached_on_a)]
            )
            seq_b = pub_b.publish([vs.stored("map", hasher.hashes(cached_on_b), cached_on_b)])
            await delivered(index, a.worker_ids[0], seq_a)
            await delivered(index, b.worker_ids[0], seq_b)
            for turn in range(4):
                follow_up = [7, 7, turn]
                assert (
                    router.route(f"a{turn}", cached_on_a + follow_up).decode_worker
                    == a.worker_ids[0]
                )
                assert (
                    router.route(f"b{turn}", cached_on_b + follow_up).decode_worker
                    == b.worker_ids[0]
                )

    run(scenario())


def test_data_parallel_ranks_are_separate_workers(farm):
    engine, pubs = farm.start("dp", "positional", dp=2)
    hasher = EngineHasher(as_bytes=False)
    tokens = [prompt(1, 2), prompt(2, 5)]

    async def scenario():
        index = PrefixIndex(BS)
        async with EngineSubscriber([engine], IndexSink(index), block_size=BS):
            for rank, pub in enumerate(pubs):
                seq = pub.publish(
                    [vs.stored("positional", hasher.hashes(tokens[rank]), tokens[rank])]
                )
                await delivered(index, engine.worker_ids[rank], seq)
            for rank in range(2):
                assert index.find_matches_for_tokens(tokens[rank]).scores == {
                    engine.worker_ids[rank]: len(tokens[rank]) // BS
                }

    run(scenario())


def test_engines_of_two_models_are_routed_and_matched_per_model(farm):
    llama, (pub_llama,) = farm.start("llama-a", "map", model="llama", adapters=("sql",))
    qwen, (pub_qwen,) = farm.start("qwen-a", "map", model="qwen")
    hasher = EngineHasher(as_bytes=True)
    tokens, adapter = prompt(1, 4), prompt(2, 2)

    async def scenario():
        index = PrefixIndex(BS)
        router = Router(index)
        register_engines(router, [llama, qwen])
        async with EngineSubscriber([llama, qwen], IndexSink(index), block_size=BS):
            [w_llama], [w_qwen] = llama.worker_ids, qwen.worker_ids
            seq_llama = pub_llama.publish(
                [
                    vs.stored("map", hasher.hashes(tokens), tokens),
                    vs.stored("map", hasher.hashes(adapter), adapter, lora_name="sql"),
                ]
            )
            seq_qwen = pub_qwen.publish([vs.stored("map", hasher.hashes(tokens), tokens)])
            await delivered(index, w_llama, seq_llama)
            await delivered(index, w_qwen, seq_qwen)
            for model, worker in (("llama", w_llama), ("qwen", w_qwen)):
                assert index.find_matches_for_tokens(tokens, namespace=model).scores == {worker: 4}
                d = router.route(f"r-{model}", tokens, model=model)
                assert d.decode_worker == worker
            assert index.find_matches_for_tokens(adapter, namespace="llama:sql").scores == {
                w_llama: 2
            }
            assert router.route("r-sql", adapter, model="llama:sql").decode_worker == w_llama
            # vLLM's own name for the adapter finds the blocks it stored under it.
            by_name = router.route("r-sql-named", adapter, model="sql")
            assert by_name.decode_worker == w_llama
            assert [c.overlap for c in by_name.explanation.decode_candidates] == [2]
            assert dict(router.models()) == {"llama": 1, "llama:sql": 1, "qwen": 1, "sql": 1}

    run(scenario())
