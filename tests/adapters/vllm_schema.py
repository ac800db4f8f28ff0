"""Mirrors of vLLM's KV event classes (vllm/distributed/kv_events.py), in the
encodings engines have published, to encode test traffic independently of
kvrouter's decoder.

- `positional`: msgspec `array_like=True, tag=True` structs (vLLM up to the
  tagged-map change; SGLang), batch `[ts, events, data_parallel_rank]`;
- `map`: tagged maps (`"type"` key) with every field of the newest schema,
  batch `{"ts", "events", "data_parallel_rank"}`;
- `legacy`: the first positional schema (no medium, no DP rank), which
  SGLang still ships.
"""

from __future__ import annotations

from typing import Any

import msgspec

ENCODINGS = ("positional", "map", "legacy")


class PositionalBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class PositionalEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class PositionalBlockStored(PositionalEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None


class PositionalBlockRemoved(PositionalEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None


class PositionalAllBlocksCleared(PositionalEvent, tag="AllBlocksCleared"):
    pass


class MapBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class MapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class MapBlockStored(MapEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class MapBlockRemoved(MapEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class MapAllBlocksCleared(MapEvent, tag="AllBlocksCleared"):
    pass


class LegacyBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class LegacyBlockStored(PositionalEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class LegacyBlockRemoved(PositionalEvent, tag="BlockRemoved"):
    block_hashes: list[int]


def stored(
    encoding: str,
    block_hashes,
    token_ids,
    *,
    parent=None,
    block_size=16,
    medium=None,
    lora_name=None,
    extra_keys=None,
    group_idx=None,
):
    if encoding == "legacy":
        return LegacyBlockStored(block_hashes, parent, token_ids, block_size, None)
    if encoding == "positional":
        return PositionalBlockStored(
            block_hashes, parent, token_ids, block_size, None, medium, lora_name, extra_keys
        )
    return MapBlockStored(
        block_hashes,
        parent,
        token_ids,
        block_size,
        None,
        medium,
        lora_name,
        extra_keys,
        group_idx,
        "full_attention" if group_idx is not None else None,
    )


def removed(encoding: str, block_hashes, *, medium=None, group_idx=None):
    if encoding == "legacy":
        return LegacyBlockRemoved(block_hashes)
    if encoding == "positional":
        return PositionalBlockRemoved(block_hashes, medium)
    return MapBlockRemoved(block_hashes, medium, group_idx)


def cleared(encoding: str):
    return MapAllBlocksCleared() if encoding == "map" else PositionalAllBlocksCleared()


def batch(encoding: str, ts: float, events: list, dp_rank: int | None):
    if encoding == "legacy":
        return LegacyBatch(ts, events)
    if encoding == "positional":
        return PositionalBatch(ts, events, dp_rank)
    return MapBatch(ts, events, dp_rank)
