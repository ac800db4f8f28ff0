"""Decoding vLLM's wire format and reading engine configs, without sockets."""

from __future__ import annotations

import hashlib

import msgspec
import pytest

from kvrouter._core import model_namespace
from kvrouter.adapters.vllm import load_engines, stable_worker_id
from kvrouter.adapters.vllm.config import offset_endpoint
from kvrouter.adapters.vllm.convert import EventConverter, engine_block_id
from kvrouter.adapters.vllm.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    WireError,
    decode_batch,
)
from kvrouter.events import Cleared, EndsReusable, Removed, Stored, Tier

from . import vllm_schema as vs

TOKENS = list(range(32))


def encode(obj) -> bytes:
    return msgspec.msgpack.encode(obj)


@pytest.mark.parametrize("encoding", vs.ENCODINGS)
def test_each_published_encoding_decodes_to_the_same_events(encoding):
    payload = encode(
        vs.batch(
            encoding,
            1.5,
            [
                vs.stored(encoding, [1, 2], TOKENS, parent=9),
                vs.removed(encoding, [2]),
                vs.cleared(encoding),
            ],
            dp_rank=3,
        )
    )
    batch = decode_batch(payload)
    assert batch.ts == 1.5
    assert batch.data_parallel_rank == (None if encoding == "legacy" else 3)
    stored, removed, cleared = batch.events
    assert (stored.block_hashes, stored.parent_block_hash, stored.token_ids, stored.block_size) == (
        [1, 2],
        9,
        TOKENS,
        16,
    )
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == [2]
    assert isinstance(cleared, AllBlocksCleared)


def test_unknown_fields_and_events_are_ignored():
    future_map = {
        "type": "BlockStored",
        "block_hashes": [1, 2],
        "parent_block_hash": None,
        "token_ids": TOKENS,
        "block_size": 16,
        "medium": "GPU",
        "a_field_from_the_future": {"x": 1},
    }
    future_positional = ["BlockRemoved", [5], "CPU", None, "later", ["fields"]]
    batch = decode_batch(
        encode(
            {
                "ts": 0.0,
                "events": [
                    future_map,
                    future_positional,
                    {"type": "BlockMoved", "block_hashes": [1]},
                    ["SomethingNew", 1, 2],
                ],
                "data_parallel_rank": 0,
                "batch_id": "new",
            }
        )
    )
    assert [type(e) for e in batch.events] == [BlockStored, BlockRemoved]
    assert batch.events[1].medium == "CPU"
    assert batch.skipped_tags == ["BlockMoved", "SomethingNew"]


def test_speculative_token_pairs_become_the_sequence():
    pairs = [[t, t + 1] for t in TOKENS]
    batch = decode_batch(encode([0.0, [["BlockStored", [1, 2], None, pairs, 16]]]))
    assert batch.events[0].token_ids == TOKENS


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"\xc1", "not msgpack"),
        (encode("batch"), "array or a map"),
        (encode([0.0, 5]), "no event list"),
        (encode([0.0, [["BlockStored", [1], None, TOKENS]]]), "without block_size"),
        (encode([0.0, [["BlockStored", ["x"], None, TOKENS, 16]]]), "ints or bytes"),
        (encode([0.0, [["BlockStored", [1], None, [-1] * 16, 16]]]), "u32"),
        (encode([0.0, [["BlockStored", [1], None, TOKENS, 0]]]), "block_size"),
        (encode([0.0, [5]]), "neither"),
        (encode([0.0, [], -2]), "data_parallel_rank"),
    ],
)
def test_malformed_payloads_are_rejected_with_a_reason(payload, message):
    with pytest.raises(WireError, match=message):
        decode_batch(payload)


def test_bytes_hashes_become_vllms_own_int_form():
    digest = hashlib.sha256(b"block").digest()
    assert engine_block_id(digest) == int.from_bytes(digest, "big") & (2**64 - 1)
    assert engine_block_id(-1) == 2**64 - 1
    assert engine_block_id(7) == 7


def test_conversion_keeps_what_the_router_can_hash():
    converter = EventConverter(block_size=16, namespace="model")
    events = converter.convert(
        [
            BlockStored([1, 2, 3], TOKENS, 16, parent_block_hash=b"\x00\x09"),
            BlockStored([4], TOKENS[:16], 32),
            BlockStored([5, 5], TOKENS, 16),
            BlockRemoved([b"\x01"], medium="cpu_pinned"),
            AllBlocksCleared(),
        ],
        worker=1,
    )
    assert events == [
        Stored([1, 2], TOKENS, parent=9, namespace="model"),
        Removed([1], tier=Tier.HOST),
        Cleared(),
    ]
    assert dict(converter.skipped) == {
        "missing_tokens": 1,
        "block_size_mismatch": 1,
        "repeated_block_id": 1,
    }


def test_extra_keys_split_a_stored_event_at_namespace_changes():
    converter = EventConverter(block_size=16)
    [plain, image] = converter.convert(
        [
            BlockStored(
                [1, 2, 3],
                TOKENS + TOKENS[:16],
                16,
                lora_name="ad",
                extra_keys=[("ad",), ("ad", "f" * 64), None],
            )
        ],
        worker=1,
    )
    assert (plain.block_ids, plain.parent, plain.namespace) == ((1,), None, "ad")
    # The block after the image's inherits its namespace through the chain.
    assert image.block_ids == (2, 3) and image.parent == 1 and image.namespace.startswith("ad#")


def test_engines_load_from_toml_with_dp_ranks(tmp_path):
    path = tmp_path / "engines.toml"
    path.write_text(
        '[[engines]]\nname = "a"\nendpoint = "tcp://h:5557"\n'
        'replay_endpoint = "tcp://h:5567"\ndata_parallel_size = 2\n'
        '[[engines]]\nname = "b"\nendpoint = "ipc:///tmp/b"\nworker_ids = [7]\n'
    )
    a, b = load_engines(path)
    assert [s.endpoint for s in a.streams] == ["tcp://h:5557", "tcp://h:5558"]
    assert [s.replay_endpoint for s in a.streams] == ["tcp://h:5567", "tcp://h:5568"]
    assert a.worker_ids == (stable_worker_id("a", 0), stable_worker_id("a", 1))
    assert a.streams[0].worker_for(1) == a.worker_ids[1]
    assert b.worker_ids == (7,) and b.streams[0].replay_endpoint is None
    assert offset_endpoint("inproc://x", 2) == "inproc://x_dp2"


@pytest.mark.parametrize(
    "config, message",
    [
        ({"engines": [{"name": "a", "endpoint": "tcp://h:1", "typo": 1}]}, "unknown keys"),
        ({"engines": [{"name": "a", "endpoint": "tcp://h:1", "worker_ids": [1, 2]}]}, "one id"),
        ({"engines": [{"name": "a", "endpoint": "tcp://h:1"}] * 2}, "unique"),
        ({"engines": [{"name": "", "endpoint": "tcp://h:1"}]}, "needs a name"),
        (
            {"engines": [{"name": "a", "endpoint": "tcp://h:1", "attention_chunk_size": -1}]},
            "attention_chunk_size must be >= 0",
        ),
        *[
            (
                {"engines": [{"name": "a", "endpoint": "tcp://h:1", "capacity_blocks": bad}]},
                "capacity_blocks must be a positive integer",
            )
            for bad in (0, -1, 1.5, True, "40000", 1 << 49)
        ],
        (
            {"engines": [{"name": "a", "endpoint": "tcp://h:1", "kv_transfer": "nixl"}]},
            "kv_transfer must be one of",
        ),
        (
            {"engines": [{"name": "a", "endpoint": "tcp://h:1", "kv_transfer": "sglang"}]},
            "bootstrap_port",
        ),
    ],
)
def test_bad_engine_configs_say_what_is_wrong(config, message):
    with pytest.raises(ValueError, match=message):
        load_engines(config)


def test_vllm_033_fields_decode():
    """Every field vLLM 0.33 adds, set, as it encodes them (tagged maps in a
    positional batch)."""
    stored = {
        "type": "BlockStored",
        "block_hashes": [1, 2],
        "parent_block_hash": None,
        "token_ids": TOKENS,
        "block_size": 16,
        "lora_id": None,
        "medium": "STORAGE",
        "lora_name": None,
        "extra_keys": [None, None],
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
        "kv_cache_spec_sliding_window": None,
        "locality": "LOCAL",
        "ownership": "nvme-0",
        "session_id": "s-1",
        "lookahead_token_ids": [[16], [99]],
    }
    removed = {
        "type": "BlockRemoved",
        "block_hashes": [2],
        "medium": "STORAGE",
        "group_idx": 0,
        "locality": "LOCAL",
        "ownership": "nvme-0",
    }
    batch = decode_batch(encode([1.0, [stored, removed], 3]))
    assert batch.data_parallel_rank == 3 and not batch.skipped_tags
    event, gone = batch.events
    assert (event.locality, event.ownership, event.session_id) == ("LOCAL", "nvme-0", "s-1")
    assert event.lookahead_token_ids == [[16], [99]]
    assert (gone.locality, gone.ownership) == ("LOCAL", "nvme-0")
    converted = EventConverter(block_size=16).convert(batch.events, worker=1)
    assert [e.tier for e in converted] == [Tier.DISK, Tier.DISK, Tier.DISK]
    # Lookahead tokens put each block in its own namespace.
    assert all(e.namespace.startswith("#") for e in converted[:2])


def test_a_salted_chain_keeps_its_salt_until_its_block_goes():
    """vLLM names the salt on a sequence's first block only; a later step's
    child of a salted block is salted too, until the parent is removed (a
    child the converter can no longer place goes to the plain namespace,
    whose chain matches nothing)."""
    converter = EventConverter(block_size=16, model="tiny")
    salted = model_namespace("tiny", "tenant-a")
    (first,) = converter.convert(
        [BlockStored([1], TOKENS, 16, extra_keys=[("tenant-a",)])], worker=1
    )
    (child,) = converter.convert([BlockStored([2], TOKENS, 16, parent_block_hash=1)], worker=1)
    assert (first.namespace, child.namespace) == (salted, salted)
    converter.convert([BlockRemoved([1, 2])], worker=1)
    (orphan,) = converter.convert([BlockStored([3], TOKENS, 16, parent_block_hash=1)], worker=1)
    assert orphan.namespace == "tiny"


def test_an_engine_with_its_own_salt_has_no_request_namespace_for_another():
    converter = EventConverter(block_size=16, namespace="mine", model="tiny")
    (stored,) = converter.convert(
        [BlockStored([1], TOKENS, 16, extra_keys=[("tenant-a",)])], worker=1
    )
    assert stored.namespace.startswith(model_namespace("tiny", "mine") + "#")


def test_a_group_of_a_kind_not_indexed_leaves_the_engine_unindexed():
    converter = EventConverter(block_size=16)
    full = BlockStored([1], TOKENS[:16], 16, group_idx=0, kv_cache_spec_kind="full_attention")
    cross = BlockStored([1], TOKENS[:16], 16, group_idx=1, kv_cache_spec_kind="cross_attention")
    assert converter.convert([full, cross], worker=1) == [Cleared()]
    assert converter.convert([full], worker=2) == [Cleared()]


def test_a_block_of_a_hybrid_engine_is_indexed_once_every_group_holds_it():
    converter = EventConverter(block_size=16)
    full = BlockStored([1], TOKENS[:16], 16, group_idx=0, kv_cache_spec_kind="full_attention")
    window = BlockStored([1], TOKENS[:16], 16, group_idx=1, kv_cache_spec_kind="sliding_window")
    cleared, stored = converter.convert([full, window], worker=1)
    assert cleared == Cleared() and stored.block_ids == (1,)
    assert converter.convert([BlockRemoved([1], group_idx=1)], worker=1) == [Removed((1,))]
    # Offloaded tiers of a hybrid engine are not indexed.
    assert converter.convert([BlockStored([2], TOKENS[:16], 16, medium="CPU")], worker=1) == []


def test_a_hybrid_prefix_ends_only_where_the_window_group_holds_the_window_before_it():
    converter = EventConverter(block_size=16)
    tokens = list(range(48))
    full = BlockStored([1, 2, 3], tokens, 16, group_idx=0, kv_cache_spec_kind="full_attention")
    # 32 tokens of window: an end needs the two blocks before it.
    window = BlockStored(
        [1, 2, 3],
        tokens,
        16,
        group_idx=1,
        kv_cache_spec_kind="sliding_window",
        kv_cache_spec_sliding_window=32,
    )
    cleared, *events = converter.convert([full, window], worker=1)
    stored = [e.block_ids for e in events if isinstance(e, Stored)]
    assert cleared == Cleared() and stored == [(1,), (2,), (3,)]
    dropped = converter.convert([BlockRemoved([1], group_idx=1)], worker=1)
    assert dropped == [EndsReusable((1, 2), reusable=False)]
    assert converter.convert([BlockRemoved([3], group_idx=0)], worker=1) == [Removed((3,))]
