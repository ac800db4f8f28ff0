"""The vLLM ZMQ/msgpack path under hostile payloads: arbitrary bytes,
arbitrary msgpack values, and near-valid batches with wrong field types.

Every payload is either decoded or refused with `WireError`; a decoded
batch always converts; the index either applies the converted events or
refuses them with ValueError and is left as it was."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvrouter._core import PrefixIndex
from kvrouter.adapters.vllm.convert import EventConverter
from kvrouter.adapters.vllm.wire import WireError, decode_batch
from kvrouter.events.core import core_events

from .conftest import fuzz_settings

BLOCK = 4

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.binary(max_size=12),
)
msgpack_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=6), inner, max_size=5)
    ),
    max_leaves=30,
)
hashes = st.one_of(st.integers(min_value=-(2**63), max_value=2**64 - 1), st.binary(max_size=9))
token_lists = st.lists(st.integers(min_value=-2, max_value=2**32), max_size=3 * BLOCK)
stored = st.tuples(
    st.just("BlockStored"),
    st.one_of(st.lists(hashes, max_size=4), msgpack_values),  # block_hashes
    st.one_of(st.none(), hashes, msgpack_values),  # parent_block_hash
    st.one_of(token_lists, st.lists(st.lists(st.integers(0, 99), max_size=2)), msgpack_values),
    st.one_of(st.just(BLOCK), st.integers(-1, 2 * BLOCK), msgpack_values),  # block_size
    st.one_of(st.none(), st.integers(0, 3), msgpack_values),  # lora_id
    st.one_of(st.none(), st.sampled_from(["GPU", "cpu", "DISK", "tape"]), msgpack_values),
    st.one_of(st.none(), st.text(max_size=4)),  # lora_name
    st.one_of(st.none(), st.lists(msgpack_values, max_size=3)),  # extra_keys
    st.one_of(st.none(), st.integers(0, 2)),  # group_idx
).map(lambda fields: list(fields[: 4 + len(fields[0]) % 7]))
removed = st.tuples(
    st.just("BlockRemoved"),
    st.one_of(st.lists(hashes, max_size=4), msgpack_values),
    st.one_of(st.none(), st.sampled_from(["GPU", "CPU"]), msgpack_values),
).map(list)
events = st.one_of(stored, removed, st.just(["AllBlocksCleared"]), msgpack_values)
positional = st.tuples(
    st.one_of(st.floats(allow_nan=False), msgpack_values),
    st.lists(events, max_size=5),
    st.one_of(st.none(), st.integers(-1, 3), msgpack_values),
).map(list)
tagged = st.lists(events, max_size=5).map(
    lambda evs: {
        "ts": 1.0,
        "events": [
            {
                "type": e[0],
                **dict(
                    zip(
                        ["block_hashes", "parent_block_hash", "token_ids", "block_size"],
                        e[1:],
                        strict=False,
                    )
                ),
            }
            if isinstance(e, list) and e and isinstance(e[0], str)
            else e
            for e in evs
        ],
    }
)


def _index_state(index: PrefixIndex):
    index.wait_sized()
    return index.stats(), index.workers()


def check_payload(payload: bytes) -> None:
    try:
        batch = decode_batch(payload)
    except WireError as e:
        assert str(e)
        return
    converted = EventConverter(BLOCK).convert(batch.events, worker=7)
    index = PrefixIndex(BLOCK)
    before = _index_state(index)
    try:
        index.apply(7, 0, core_events(converted))
    except ValueError as e:
        assert str(e)
        assert _index_state(index) == before


@fuzz_settings
@given(st.binary(max_size=200))
def test_arbitrary_bytes(payload):
    check_payload(payload)


@fuzz_settings
@given(msgpack_values)
def test_arbitrary_msgpack(value):
    check_payload(msgspec.msgpack.encode(value))


@fuzz_settings
@given(st.one_of(positional, tagged))
def test_near_valid_batches(batch):
    check_payload(msgspec.msgpack.encode(batch))


@pytest.mark.parametrize("ts", ["soon", [1], {"a": 1}])
def test_a_timestamp_of_the_wrong_type_is_a_wire_error(ts):
    with pytest.raises(WireError, match="ts"):
        decode_batch(msgspec.msgpack.encode([ts, [], None]))
