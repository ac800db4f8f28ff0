"""vLLM's KV event wire format (SGLang ships a variant of it), decoded by tag
and field name.

A ZMQ message is `[topic, seq (8-byte big-endian), payload]`; a replay answer
is `[b"", topic, seq, payload]` per batch, ended by `[b"", b"", -1, b""]`
(older engines leave the topic out). The payload is a msgpack `EventBatch`,
always positional: `[ts, events, data_parallel_rank]` (a map with those keys
is read too). Its events come in two encodings:

- tagged maps, what vLLM sends (0.33 included): `{"type": tag, field: ...}`,
  fields left out when they hold their default;
- positional, what SGLang and older vLLM send: `[tag, field, ...]` in
  declaration order.

Fields have only ever been appended, so positional events are read by
position up to the fields known here and anything after is ignored; maps are
read by name and unknown keys are ignored. The one divergence is SGLang's
seventh field: vLLM's is `lora_name` (a string), SGLang's newest
`BlockStoredWithMetadata` puts `metadata` there, a map with its cache salt
(sgl-project/sglang, python/sglang/srt/disaggregation/kv_events.py; older
SGLang stops at `medium`). It is told apart by its type. Events with an
unknown tag are skipped and reported in `EngineBatch.skipped_tags`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

# Declaration order in vLLM's `BlockStored` / `BlockRemoved` (the positional
# layout). Older engines stop early; the rest default to None.
STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
)
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx", "locality", "ownership")

BlockHash = int | bytes


class WireError(ValueError):
    """A payload that does not follow the schema."""


@dataclass
class BlockStored:
    block_hashes: list[BlockHash]
    token_ids: list[int]
    block_size: int
    parent_block_hash: BlockHash | None = None
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    # One entry per block: what besides the tokens went into its hash
    # (multimodal hashes, LoRA name, cache salt, prompt-embedding hashes).
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    # "full_attention", "sliding_window", "mamba", ...: what kind of KV cache
    # group the blocks belong to (vLLM 0.33 on).
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    # Speculative (EAGLE) engines hash each block with the tokens after it,
    # one list per block.
    lookahead_token_ids: list[list[int]] | None = None
    # SGLang's cache salt (its `metadata` field).
    cache_salt: str | None = None

    @property
    def placeholder(self) -> bool:
        """vLLM's offloading connector announces offloaded blocks without
        tokens or block size unless `self_describing_kv_events` is on: such
        an event says a block exists, not what it holds."""
        return self.block_size == 0 and not self.token_ids


@dataclass
class BlockRemoved:
    block_hashes: list[BlockHash]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


@dataclass
class AllBlocksCleared:
    pass


WireEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass
class EngineBatch:
    ts: float
    events: list[WireEvent]
    data_parallel_rank: int | None = None
    skipped_tags: list[str] = field(default_factory=list)


_decoder = msgspec.msgpack.Decoder()


def decode_batch(payload: bytes) -> EngineBatch:
    try:
        raw = _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise WireError(f"payload is not msgpack: {exc}") from exc
    if isinstance(raw, list):
        ts, events, rank = (raw + [None, None, None])[:3]
    elif isinstance(raw, dict):
        ts, events = raw.get("ts"), raw.get("events")
        rank = raw.get("data_parallel_rank", raw.get("dp_rank"))
    else:
        raise WireError(f"an event batch is an array or a map, got {type(raw).__name__}")
    if not isinstance(events, list):
        raise WireError("the batch has no event list")
    if rank is not None and (not isinstance(rank, int) or rank < 0):
        raise WireError(f"bad data_parallel_rank {rank!r}")
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, float))):
        raise WireError(f"bad ts {ts!r}: the batch timestamp is a number")
    batch = EngineBatch(float(ts or 0.0), [], rank)
    for index, raw_event in enumerate(events):
        tag, fields = _split(raw_event, index)
        event = _build(tag, fields, index)
        if event is None:
            batch.skipped_tags.append(str(tag))
        else:
            batch.events.append(event)
    return batch


def _split(raw: Any, index: int) -> tuple[Any, dict[str, Any] | list[Any]]:
    if isinstance(raw, list) and raw:
        return raw[0], raw[1:]
    if isinstance(raw, dict):
        return raw.get("type"), raw
    raise WireError(f"event {index}: neither a tagged array nor a tagged map")


def _fields(names: tuple[str, ...], values: dict | list) -> dict[str, Any]:
    if isinstance(values, dict):
        return {name: values[name] for name in names if name in values}
    return dict(zip(names, values, strict=False))


def _build(tag: Any, values: dict | list, index: int) -> WireEvent | None:
    if tag == "BlockStored":
        got = _fields(STORED_FIELDS, values)
        if isinstance(got.get("lora_name"), dict):
            got["cache_salt"] = _salt(got.pop("lora_name"), index)
        for required in ("block_hashes", "token_ids", "block_size"):
            if required not in got:
                raise WireError(f"event {index}: BlockStored without {required}")
        event = BlockStored(**got)
        _check_hashes(event.block_hashes, index)
        if event.parent_block_hash is not None:
            _check_hashes([event.parent_block_hash], index)
        if not isinstance(event.block_size, int) or event.block_size < 0:
            raise WireError(f"event {index}: bad block_size {event.block_size!r}")
        event.token_ids = _tokens(event.token_ids, index)
        if event.block_size == 0 and not event.placeholder:
            raise WireError(f"event {index}: block_size 0 with tokens")
        if event.lookahead_token_ids is not None:
            event.lookahead_token_ids = _lookahead(event.lookahead_token_ids, index)
        return event
    if tag == "BlockRemoved":
        got = _fields(REMOVED_FIELDS, values)
        if "block_hashes" not in got:
            raise WireError(f"event {index}: BlockRemoved without block_hashes")
        event = BlockRemoved(**got)
        _check_hashes(event.block_hashes, index)
        return event
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _check_hashes(hashes: Any, index: int) -> None:
    if not isinstance(hashes, list) or not all(
        isinstance(h, (int, bytes)) and not isinstance(h, bool) for h in hashes
    ):
        raise WireError(f"event {index}: block hashes must be ints or bytes")


def _salt(metadata: dict, index: int) -> str | None:
    salt = metadata.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise WireError(f"event {index}: cache_salt is not a string")
    return salt


def _lookahead(lists: Any, index: int) -> list[list[int]]:
    if not isinstance(lists, list) or not all(isinstance(tokens, list) for tokens in lists):
        raise WireError(f"event {index}: lookahead_token_ids is not a list of lists")
    return [_tokens(tokens, index) for tokens in lists]


def _tokens(tokens: Any, index: int) -> list[int]:
    """Token ids, flat. Speculative (EAGLE) engines send (token, next token)
    pairs; the first of each pair is the sequence itself."""
    if not isinstance(tokens, list):
        raise WireError(f"event {index}: token_ids is not a list")
    if tokens and isinstance(tokens[0], list):
        tokens = [pair[0] if isinstance(pair, list) and pair else pair for pair in tokens]
    if not all(isinstance(t, int) and 0 <= t < 2**32 for t in tokens):
        raise WireError(f"event {index}: token ids must be u32 ints")
    return tokens
