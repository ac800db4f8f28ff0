"""SGLang's KV events, in each version's own field order, over real ZMQ
sockets into the index.

The structs are SGLang's declarations (sgl-project/sglang,
python/sglang/srt/disaggregation/kv_events.py): positional
(`array_like=True`) events whose `BlockStored` ends at `medium`; the newest
(main at 612d579) sends `BlockStoredWithMetadata` for salted requests, with
`metadata {cache_salt}` seventh, where vLLM has `lora_name`."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from kvrouter import PrefixIndex
from kvrouter.adapters.sink import IndexSink
from kvrouter.adapters.vllm import EngineSubscriber

from .engine_hashes import BS, EngineHasher, prompt
from .test_vllm_events import delivered, run


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    attn_dp_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStoredMetadata(msgspec.Struct, omit_defaults=True, gc=False):
    cache_salt: str


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None


class BlockStoredWithMetadata(BlockStored, tag="BlockStored", kw_only=True):
    metadata: BlockStoredMetadata


def test_salted_sglang_blocks_match_only_their_salt(farm):
    engine, (pub,) = farm.start("sglang", "positional")
    hasher = EngineHasher(as_bytes=False)
    salted, plain = prompt(1, 3), prompt(2, 2)
    encoder = msgspec.msgpack.Encoder()

    async def scenario():
        index = PrefixIndex(BS)
        async with EngineSubscriber([engine], IndexSink(index), block_size=BS):
            worker = engine.worker_ids[0]
            events = [
                BlockStoredWithMetadata(
                    hasher.hashes(salted),
                    None,
                    salted,
                    BS,
                    None,
                    "GPU",
                    metadata=BlockStoredMetadata("tenant-a"),
                ),
                BlockStored(hasher.hashes(plain), None, plain, BS, None, "GPU"),
            ]
            seq = pub.publish_raw(encoder.encode(EventBatch(time.time(), events, 0)))
            await delivered(index, worker, seq)
            assert index.workers()[worker][0] == 3 + 2
            assert index.find_matches_for_tokens(salted).scores == {}
            assert index.find_matches_for_tokens(salted, namespace="tenant-a").scores == {worker: 3}
            assert index.find_matches_for_tokens(salted, namespace="tenant-b").scores == {}
            assert index.find_matches_for_tokens(plain).scores == {worker: 2}
            assert index.find_matches_for_tokens(plain, namespace="tenant-a").scores == {}

    run(scenario())


def test_sglang_blocks_without_medium_or_metadata_are_device_blocks(farm):
    """SGLang before `medium`: five fields."""
    engine, (pub,) = farm.start("sglang", "positional")
    hasher = EngineHasher(as_bytes=False)
    tokens = prompt(3, 2)
    encoder = msgspec.msgpack.Encoder()

    async def scenario():
        index = PrefixIndex(BS)
        async with EngineSubscriber([engine], IndexSink(index), block_size=BS):
            worker = engine.worker_ids[0]
            event = ["BlockStored", hasher.hashes(tokens), None, tokens, BS, None]
            seq = pub.publish_raw(encoder.encode([time.time(), [event]]))
            await delivered(index, worker, seq)
            assert index.find_matches_for_tokens(tokens).tiers == {worker: (2, 0, 0)}

    run(scenario())
