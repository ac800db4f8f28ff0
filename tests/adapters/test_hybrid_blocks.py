"""HybridBlocks over random stores and removals in a full-attention group
and a sliding-window (or chunked local attention) group, its events
applied to a real index: for every prefix of every sequence, the index
counts what vLLM's hybrid lookup reuses (the longest prefix the full group
holds whole and whose window, or last chunk, the other group holds), and a
block is stored only after its parent."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvrouter import PrefixIndex
from kvrouter.adapters.vllm.hybrid import WHOLE, EndRule, HybridBlocks
from kvrouter.events import EndsReusable, Removed, Stored
from kvrouter.events.core import core_events

# Two sequences: 1-2-3-4-9 with a branch 2-5, and 6-7-8.
PARENTS = {1: None, 2: 1, 3: 2, 4: 3, 9: 4, 5: 2, 6: None, 7: 6, 8: 7}
LEAVES = (9, 5, 8)
FULL, WINDOW = 0, 1
# One token a block; the window group needs the 2 blocks before an end; a
# chunked group's chunks are 3 blocks.
BLOCK_SIZE, WINDOW_BLOCKS, CHUNK = 1, 2, 3
RULES = {
    "sliding window": EndRule(window=WINDOW_BLOCKS),
    "chunked local": EndRule(chunk_tokens=CHUNK, block_size=BLOCK_SIZE),
}
GROUPS = st.sampled_from((FULL, WINDOW))
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("stored"), GROUPS, st.sampled_from(sorted(PARENTS))),
        st.tuples(st.just("removed"), GROUPS, st.lists(st.sampled_from(sorted(PARENTS)))),
    ),
    max_size=40,
)


def chain(block: int | None) -> list[int]:
    """The sequence from its first block to `block`."""
    out = []
    while block is not None:
        out.append(block)
        block = PARENTS[block]
    return out[::-1]


def vllm_hit(rule: str, sequence: list[int], held: dict[int, set[int]]) -> int:
    """vLLM's hybrid hit: the longest prefix the full group holds whole and
    whose last WINDOW_BLOCKS blocks (all, when shorter), or the blocks of
    whose last chunk, the other group holds."""
    for length in range(len(sequence), 0, -1):
        whole = all(b in held[FULL] for b in sequence[:length])
        start = (
            max(0, length - WINDOW_BLOCKS) if rule == "sliding window" else length // CHUNK * CHUNK
        )
        if whole and all(b in held[WINDOW] for b in sequence[start:length]):
            return length
    return 0


@pytest.mark.parametrize("rule", RULES)
@given(operations=OPERATIONS)
def test_the_index_counts_what_vllms_hybrid_lookup_reuses(rule, operations):
    hybrid = HybridBlocks()
    index = PrefixIndex(BLOCK_SIZE)
    held: dict[int, set[int]] = {FULL: set(), WINDOW: set()}
    indexed: set[int] = set()
    events = hybrid.know({FULL: WHOLE, WINDOW: RULES[rule]})
    for seq, (kind, group, blocks) in enumerate(operations):
        if kind == "stored":
            held[group].add(blocks)
            events += hybrid.stored(group, [Stored([blocks], [blocks], parent=PARENTS[blocks])])
        else:
            held[group].difference_update(blocks)
            events += hybrid.removed(group, blocks)
        for event in events:
            if isinstance(event, Stored):
                (block,) = event.block_ids
                assert event.parent is None or event.parent in indexed
                indexed.add(block)
            elif isinstance(event, Removed):
                indexed.difference_update(event.block_ids)
            else:
                assert isinstance(event, EndsReusable)
                assert indexed.issuperset(event.block_ids)
        index.apply(1, seq, core_events(events))
        events = []
        for leaf in LEAVES:
            sequence = chain(leaf)
            for length in range(1, len(sequence) + 1):
                scores = index.find_matches_for_tokens(sequence[:length]).scores
                assert scores.get(1, 0) == vllm_hit(rule, sequence[:length], held), (
                    sequence[:length],
                    held,
                )


def test_a_window_held_at_the_end_of_a_prefix_is_reused_though_its_start_was_dropped():
    hybrid = HybridBlocks()
    index = PrefixIndex(BLOCK_SIZE)
    events = hybrid.know({FULL: WHOLE, WINDOW: EndRule(window=WINDOW_BLOCKS)})
    for group in (FULL, WINDOW):
        events += hybrid.stored(group, [Stored([1, 2, 3, 4], [1, 2, 3, 4])])
    events += hybrid.removed(WINDOW, [1, 2])
    index.apply(1, 0, core_events(events))
    assert index.find_matches_for_tokens([1, 2, 3, 4]).scores == {1: 4}
    assert index.find_matches_for_tokens([1, 2, 3]).scores == {}
