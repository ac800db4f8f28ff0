"""Block hashing as src_rust/hashing.rs defines it, from every accepted input
type, checked against an independent implementation."""

import array

import numpy as np
import pytest
import xxhash

import kvrouter


def reference_seq_hashes(tokens, block_size, namespace):
    """An independent implementation: python-xxhash over little-endian bytes."""
    seed = xxhash.xxh3_64_intdigest(namespace.encode())
    hashes, parent = [], None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = np.asarray(tokens[start : start + block_size], dtype="<u4").tobytes()
        local = xxhash.xxh3_64_intdigest(block, seed=seed)
        if parent is None:
            parent = local
        else:
            parent = xxhash.xxh3_64_intdigest(
                parent.to_bytes(8, "little") + local.to_bytes(8, "little")
            )
        hashes.append(parent)
    return hashes


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_matches_the_reference_definition(block_size):
    tokens = list(range(1000, 1000 + 5 * block_size + 3))
    assert kvrouter.hash_tokens(tokens, block_size, "llama-3") == reference_seq_hashes(
        tokens, block_size, "llama-3"
    )


def test_local_hashes_and_chaining_compose():
    tokens = list(range(64))
    locals_ = kvrouter.local_block_hashes(tokens, 16, "m")
    assert kvrouter.chain_hashes(locals_) == kvrouter.hash_tokens(tokens, 16, "m")
    seqs = kvrouter.hash_tokens(tokens, 16, "m")
    assert kvrouter.chain_hashes(locals_[2:], parent=seqs[1]) == seqs[2:]


def test_partial_last_block_is_not_hashed():
    assert kvrouter.hash_tokens(list(range(15)), 16) == []
    assert len(kvrouter.hash_tokens(list(range(47)), 16)) == 2


# Every form the core takes token ids in.
INPUT_FORMS = [
    list,
    tuple,
    lambda t: array.array("I", t),
    lambda t: np.asarray(t, dtype=np.uint32),
    lambda t: np.asarray(t, dtype=np.int32),
    lambda t: np.asarray(t, dtype=np.int64),
    lambda t: np.asarray(t, dtype="<u4").tobytes(),
    lambda t: np.repeat(np.asarray(t, dtype=np.uint32), 2)[::2],
    lambda t: list(np.asarray(t, dtype=np.int64)),
]
INPUT_FORM_IDS = [
    "list",
    "tuple",
    "array",
    "uint32",
    "int32",
    "int64",
    "bytes",
    "strided",
    "numpy ints",
]


@pytest.mark.parametrize("make", INPUT_FORMS, ids=INPUT_FORM_IDS)
def test_every_input_type_hashes_the_same(make):
    tokens = list(range(70))
    assert kvrouter.hash_tokens(make(tokens)) == kvrouter.hash_tokens(tokens)


@pytest.mark.parametrize("make", INPUT_FORMS, ids=INPUT_FORM_IDS)
def test_every_input_type_takes_an_empty_prompt(make):
    assert kvrouter.hash_tokens(make([])) == []


def test_namespaces_separate_caches():
    tokens = list(range(32))
    assert kvrouter.hash_tokens(tokens, namespace="a") != kvrouter.hash_tokens(
        tokens, namespace="b"
    )


@pytest.mark.parametrize(
    ("tokens", "error", "message"),
    [
        (np.zeros(32, dtype=np.float32), TypeError, "dtype float32"),
        ("not tokens", TypeError, "got str"),
        ([1, -2, 3], ValueError, "integers in"),
        ([1, 2**32], ValueError, "integers in"),
        ([1, 2.0], ValueError, "integers in"),
        (np.array([1, -2], dtype=np.int32), ValueError, "outside"),
        (np.array([2**40], dtype=np.int64), ValueError, "outside"),
        (b"\x00\x01\x02", ValueError, "whole little-endian"),
        (np.zeros((4, 4), dtype=np.uint32), ValueError, "1-D"),
    ],
)
def test_bad_tokens_get_a_clear_error(tokens, error, message):
    with pytest.raises(error, match=message):
        kvrouter.hash_tokens(tokens)


def test_zero_block_size_is_refused():
    with pytest.raises(ValueError, match="block_size"):
        kvrouter.hash_tokens([1, 2, 3], 0)


def test_array_form_holds_the_same_hashes():
    tokens = list(range(100))
    hashes = kvrouter.hash_tokens_array(tokens, 16, "m")
    assert hashes.typecode == "Q"
    assert list(hashes) == kvrouter.hash_tokens(tokens, 16, "m")
