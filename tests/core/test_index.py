"""The prefix index through its Python API, including bad input."""

import threading
from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvrouter import Cleared, PrefixIndex, Removed, Stored, Tier, hash_tokens

BS = 16


def conversation(turn_tokens):
    return list(range(turn_tokens))


def store(index, worker, seq, tokens, parent=None, tier=Tier.DEVICE, **kw):
    hashes = hash_tokens(tokens, BS)
    if parent is not None:
        hashes = hashes[len(hash_tokens(parent, BS)) :]
        tokens = tokens[len(parent) :]
    return index.apply(
        worker,
        seq,
        [Stored(hashes, tokens, parent=hash_tokens(parent, BS)[-1] if parent else None, tier=tier)],
        **kw,
    )


def test_route_lookup_finds_the_worker_with_the_longest_prefix():
    index = PrefixIndex(BS)
    prompt = conversation(128)
    store(index, 1, 0, prompt)
    store(index, 2, 0, prompt[:64])
    scores = index.find_matches(hash_tokens(prompt, BS))
    assert scores.scores == {1: 8, 2: 4}
    assert index.find_matches_for_tokens(np.asarray(prompt, dtype=np.uint32)).scores == {
        1: 8,
        2: 4,
    }


def test_a_continued_conversation_extends_the_parent():
    index = PrefixIndex(BS)
    first = conversation(64)
    second = first + list(range(5000, 5032))
    store(index, 7, 0, first)
    store(index, 7, 1, second, parent=first)
    assert index.find_matches(hash_tokens(second, BS)).depth(7) == 6


def test_tiers_are_reported_and_removed_separately():
    index = PrefixIndex(BS)
    tokens = conversation(32)
    hashes = hash_tokens(tokens, BS)
    store(index, 1, 0, tokens, tier="host")
    assert index.find_matches(hashes).tiers == {1: (0, 2, 0)}
    index.apply(1, 1, [Removed(hashes[1:], tier=Tier.HOST)])
    assert index.find_matches(hashes).tiers == {1: (0, 1, 0)}


def test_gap_and_duplicate_batches_change_nothing():
    index = PrefixIndex(BS)
    store(index, 1, 0, conversation(32))
    assert store(index, 1, 0, conversation(32)).status == "duplicate"
    gap = index.apply(1, 4, [Cleared()])
    assert (gap.status, gap.expected_seq) == ("gap", 1)
    assert index.stats()["blocks"] == 2
    index.resync(1, 4, [Stored(hash_tokens(conversation(16), BS), conversation(16))])
    assert index.workers() == {1: (1, 5)}


def test_unknown_worker_is_a_key_error():
    index = PrefixIndex(BS)
    with pytest.raises(KeyError, match="worker 3 is not in the index"):
        index.remove_worker(3)


def test_strict_removal_of_an_unknown_block_is_refused_atomically():
    index = PrefixIndex(BS)
    tokens = conversation(32)
    hashes = hash_tokens(tokens, BS)
    store(index, 1, 0, tokens)
    with pytest.raises(KeyError, match="does not hold block"):
        index.apply(1, 1, [Removed(hashes[:1]), Removed([12345])], strict=True)
    assert index.find_matches(hashes).scores == {1: 2}
    assert index.workers() == {1: (2, 1)}
    lenient = index.apply(1, 1, [Removed([12345])])
    assert (lenient.status, lenient.unknown_removals) == ("applied", 1)


@pytest.mark.parametrize(
    ("make_event", "error", "message"),
    [
        (lambda: Stored([1, 2], list(range(20))), ValueError, "block_size is 16"),
        (lambda: Stored([1, 2], list(range(21))), ValueError, "same positive number per block"),
        (lambda: Stored([1, 2], local_hashes=[5]), ValueError, "1 local hashes for 2"),
        (lambda: Stored([], []), ValueError, "no blocks"),
        (lambda: "stored", TypeError, "not Stored, Removed, EndsReusable or Cleared"),
    ],
)
def test_malformed_events_are_refused_and_leave_state_intact(make_event, error, message):
    index = PrefixIndex(BS)
    store(index, 1, 0, conversation(32))
    with pytest.raises(error, match=message):
        index.apply(1, 1, [Removed(hash_tokens(conversation(32), BS)), make_event()])
    assert index.stats()["blocks"] == 2
    assert index.workers() == {1: (2, 1)}


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: Stored([1], token_ids=[0] * 16, local_hashes=[1]), ValueError, "exactly one"),
        (lambda: Stored([1], np.zeros(16, dtype=np.float64)), TypeError, "float64"),
        (lambda: Removed([1], tier="tape"), ValueError, "unknown tier"),
        (lambda: Removed([-1]), TypeError, "block hashes"),
    ],
)
def test_bad_event_fields_are_refused_at_construction(build, error, message):
    with pytest.raises(error, match=message):
        build()


U64_EDGES = [0, 1, 2**30 - 1, 2**30, 2**60, 2**63 - 1, 2**63, 2**64 - 1]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(U64_EDGES) | st.integers(0, 2**64 - 1), min_size=1, max_size=40, unique=True
    )
)
def test_ints_of_any_u64_size_are_read_exactly_from_lists(block_ids):
    """Engine block ids and sequence hashes span all of u64; a list (or tuple)
    of them must read as an array('Q') of the same values does."""
    index = PrefixIndex(BS)
    tokens = conversation(BS * len(block_ids))
    index.apply(1, 0, [Stored(block_ids, tokens)])
    seq_hashes = hash_tokens(tokens, BS)
    for query in (seq_hashes, tuple(seq_hashes), array("Q", seq_hashes)):
        assert index.find_matches(query).scores == {1: len(block_ids)}
    index.apply(1, 1, [Removed(block_ids)], strict=True)
    assert index.stats()["blocks"] == 0


@pytest.mark.parametrize("bad", [2**64, -1, 2**70])
def test_a_hash_outside_u64_in_a_list_is_refused(bad):
    with pytest.raises(TypeError, match="block hashes"):
        PrefixIndex(BS).find_matches([1, bad])


def test_wrong_dtype_for_query_is_a_type_error():
    with pytest.raises(TypeError):
        PrefixIndex(BS).find_matches(np.zeros(4, dtype=np.float32))


def test_apply_many_isolates_a_bad_batch():
    index = PrefixIndex(BS)
    tokens = conversation(32)
    hashes = hash_tokens(tokens, BS)
    outcomes = index.apply_many(
        [
            (1, 0, [Stored(hashes, tokens)]),
            (2, 0, [Removed([99])]),
            (3, 0, [Stored(hashes, tokens)]),
        ],
        strict=True,
    )
    assert [o.status for o in outcomes] == ["applied", "rejected", "applied"]
    assert "does not hold block" in outcomes[1].error
    assert index.find_matches(hashes).scores == {1: 2, 3: 2}


def test_approximate_entries_route_bursts_then_expire():
    index = PrefixIndex(BS, manual_clock=True)
    hashes = hash_tokens(conversation(64), BS)
    index.insert_approximate(5, hashes, ttl_s=0.05)
    assert index.find_matches(hashes).scores == {5: 4}
    index.set_time(0.1)
    assert index.find_matches(hashes).scores == {}


def test_a_manual_clock_expires_approximate_entries_on_virtual_time():
    index = PrefixIndex(BS, manual_clock=True)
    hashes = hash_tokens(conversation(64), BS)
    index.set_time(100.0)
    index.insert_approximate(5, hashes, ttl_s=30.0)
    index.set_time(129.0)
    assert index.find_matches(hashes).scores == {5: 4}
    index.set_time(50.0)  # never backward
    index.set_time(130.5)
    assert index.find_matches(hashes).scores == {}
    with pytest.raises(ValueError, match="wall clock"):
        PrefixIndex(BS).set_time(1.0)


def test_memory_bound_prunes_least_recently_used():
    index = PrefixIndex(BS, max_blocks=50)
    hot = conversation(64)
    store(index, 1, 0, hot)
    for seq in range(1, 40):
        store(index, 1, seq, list(range(seq * 1000, seq * 1000 + 32)))
        index.find_matches(hash_tokens(hot, BS))
    stats = index.stats()
    assert stats["blocks"] <= 50 and stats["pruned_total"] > 0
    assert index.find_matches(hash_tokens(hot, BS)).depth(1) == 4


def test_snapshot_restores_blocks_and_stream_positions():
    index = PrefixIndex(BS)
    store(index, 1, 0, conversation(64))
    restored = PrefixIndex.restore(index.snapshot())
    assert restored.find_matches(hash_tokens(conversation(64), BS)).scores == {1: 4}
    assert restored.workers() == {1: (4, 1)}
    with pytest.raises(ValueError, match="bad snapshot"):
        PrefixIndex.restore(b"garbage")


def test_concurrent_readers_and_writers_stay_consistent():
    index = PrefixIndex(BS)
    prompts = [list(range(w * 10_000, w * 10_000 + 256)) for w in range(8)]
    errors = []

    def writer(worker):
        try:
            for seq in range(50):
                tokens = prompts[worker]
                index.apply(worker, seq, [Stored(hash_tokens(tokens, BS), tokens)])
        except Exception as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    def reader():
        try:
            for _ in range(200):
                for prompt in prompts:
                    depth = index.find_matches_for_tokens(prompt).scores
                    assert all(d == 16 for d in depth.values())
        except Exception as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    threads += [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    stats = index.stats()
    assert (stats["blocks"], stats["workers"], stats["approximate"]) == (128, 8, 0)
    assert stats["pruned_total"] == 0
