"""Block manager: reference counts, prefix cache, LRU reuse and KV events."""

from functools import partial

from hypothesis import given, settings
from hypothesis import strategies as st

from kvrouter._core import hash_tokens
from kvrouter.engine.block_manager import BlockManager
from kvrouter.engine.sampling_params import SamplingParams
from kvrouter.engine.sequence import Sequence

from .recording_sink import RecordingSink

BLOCK_SIZE = 4


def make_manager(num_blocks: int, enable_prefix_caching: bool = True):
    sink = RecordingSink(BLOCK_SIZE)
    manager = BlockManager(
        num_blocks,
        BLOCK_SIZE,
        partial(hash_tokens, block_size=BLOCK_SIZE),
        sink,
        enable_prefix_caching,
    )
    return manager, sink


def run_prefill(manager: BlockManager, tokens: list[int], name: str = "r") -> Sequence:
    """Admits a sequence and pretends its whole prompt was computed."""
    seq = Sequence(name, tokens, SamplingParams())
    hits = manager.prefix_hits(seq)
    assert manager.can_admit(hits, seq.num_tokens)
    manager.admit(seq, hits)
    manager.grow(seq, seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens
    manager.commit(seq)
    return seq


def test_full_blocks_are_cached_under_router_hashes_with_parent_and_tokens():
    manager, sink = make_manager(8)
    tokens = list(range(10))
    run_prefill(manager, tokens)
    hashes = hash_tokens(tokens, block_size=BLOCK_SIZE)
    # Two full blocks; the partial tail (2 tokens) is never cached.
    assert sink.events == [("stored", None, hashes, tokens[:8])]


def test_a_shared_prefix_is_reused_not_recomputed():
    manager, sink = make_manager(8)
    first = run_prefill(manager, list(range(12)), "a")
    second = Sequence("b", list(range(8)) + [90, 91, 92, 93, 94], SamplingParams())
    hits = manager.prefix_hits(second)
    assert hits == first.block_table[:2]
    manager.admit(second, hits)
    assert second.num_computed_tokens == 8
    # Shared blocks are referenced by both sequences.
    assert [manager.blocks[b].ref_count for b in hits] == [2, 2]


def test_the_block_holding_the_last_token_is_never_a_hit():
    manager, _ = make_manager(8)
    run_prefill(manager, list(range(8)), "a")
    again = Sequence("b", list(range(8)), SamplingParams())
    # Its logits are needed to sample, so only the first block may come from the cache.
    assert len(manager.prefix_hits(again)) == 1


def test_freed_cached_blocks_stay_hittable_until_reused_lru_first():
    manager, sink = make_manager(4)
    old = run_prefill(manager, list(range(100, 108)), "old")
    new = run_prefill(manager, list(range(200, 208)), "new")
    manager.free(old)
    manager.free(new)
    assert manager.num_free_blocks == 4
    assert len(manager.prefix_hits(Sequence("x", list(range(100, 109)), SamplingParams()))) == 2

    # Two fresh blocks are needed: the least recently freed ones (old's) go first.
    run_prefill(manager, list(range(300, 306)), "fresh")
    old_hashes = hash_tokens(list(range(100, 108)), block_size=BLOCK_SIZE)
    removed = [event for event in sink.events if event[0] == "removed"]
    assert sorted(block for event in removed for block in event[1]) == sorted(old_hashes)
    assert manager.prefix_hits(Sequence("y", list(range(100, 109)), SamplingParams())) == []
    assert len(manager.prefix_hits(Sequence("z", list(range(200, 209)), SamplingParams()))) == 2


def test_duplicate_blocks_computed_concurrently_are_announced_once():
    manager, sink = make_manager(8)
    tokens = list(range(8))
    # Both admitted before either is computed: no hits for the second.
    first, second = (Sequence(n, tokens + [50], SamplingParams()) for n in "ab")
    for seq in (first, second):
        manager.admit(seq, manager.prefix_hits(seq))
        manager.grow(seq, seq.num_tokens)
    for seq in (first, second):
        seq.num_computed_tokens = seq.num_tokens
        manager.commit(seq)
    assert sink.stored_ids() == hash_tokens(tokens, block_size=BLOCK_SIZE)
    manager.free(second)
    # The duplicate copies went back to the plain free pool, the originals stay cached.
    assert len(manager.cached) == 2


def test_pinned_blocks_survive_memory_pressure():
    manager, _ = make_manager(4)
    seq = run_prefill(manager, list(range(8)), "a")
    hashes = hash_tokens(list(range(8)), block_size=BLOCK_SIZE)
    assert manager.pin(hashes) == hashes
    manager.free(seq)
    assert manager.num_free_blocks == 2
    run_prefill(manager, list(range(50, 58)), "b")
    assert len(manager.lookup(hashes)) == 2
    manager.unpin(hashes)
    assert manager.num_free_blocks == 2


def test_reset_prefix_cache_emits_cleared_only_when_idle():
    manager, sink = make_manager(4)
    seq = run_prefill(manager, list(range(8)))
    assert not manager.reset_prefix_cache()
    manager.free(seq)
    assert manager.reset_prefix_cache()
    assert sink.events[-1] == ("cleared",)
    assert manager.cached == {}


def test_without_prefix_caching_nothing_is_cached_or_announced():
    manager, sink = make_manager(8, enable_prefix_caching=False)
    seq = run_prefill(manager, list(range(12)))
    manager.free(seq)
    assert sink.events == []
    assert manager.prefix_hits(Sequence("b", list(range(13)), SamplingParams())) == []


operations = st.lists(
    st.tuples(
        st.sampled_from(["add", "free", "decode"]),
        st.integers(0, 3),  # which prefix family
        st.integers(1, 14),  # prompt length
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(operations)
def test_router_view_and_ref_counts_stay_exact(ops):
    """Whatever the mix of admissions, decodes and frees, the events describe the
    cache exactly, and every block is either free or referenced."""
    manager, sink = make_manager(10)
    live: list[Sequence] = []
    for index, (op, family, length) in enumerate(ops):
        if op == "add":
            seq = Sequence(f"s{index}", [family * 100 + i for i in range(length)], SamplingParams())
            hits = manager.prefix_hits(seq)
            if not manager.can_admit(hits, seq.num_tokens):
                continue
            manager.admit(seq, hits)
            manager.grow(seq, seq.num_tokens)
            seq.num_computed_tokens = seq.num_tokens
            manager.commit(seq)
            live.append(seq)
        elif op == "decode" and live:
            seq = live[family % len(live)]
            if manager.blocks_needed(seq, seq.num_tokens + 1) > manager.num_free_blocks:
                continue
            seq.token_ids.append(length)
            manager.grow(seq, seq.num_tokens)
            seq.num_computed_tokens = seq.num_tokens
            manager.commit(seq)
        elif op == "free" and live:
            manager.free(live.pop(family % len(live)))

        assert set(sink.view) == set(manager.cached)
        for block_hash, block_id in manager.cached.items():
            assert sink.view[block_hash] == manager.blocks[block_id].token_ids
        references = {}
        for seq in live:
            for block_id in seq.block_table:
                references[block_id] = references.get(block_id, 0) + 1
        for block in manager.blocks:
            assert block.ref_count == references.get(block.block_id, 0)
        assert manager.num_free_blocks == manager.num_blocks - len(references)
