"""HybridBlocks over random stores and removals in two KV cache groups: the
blocks its events leave in the index are exactly those whose whole chain
every known group holds, and a block is stored only after its parent."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvrouter.adapters.vllm.hybrid import HybridBlocks
from kvrouter.events import Removed, Stored

# Two sequences: 1-2-3-4 with a branch 2-5, and 6-7-8.
PARENTS = {1: None, 2: 1, 3: 2, 4: 3, 5: 2, 6: None, 7: 6, 8: 7}
GROUPS = st.integers(0, 1)
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("stored"), GROUPS, st.sampled_from(sorted(PARENTS))),
        st.tuples(st.just("removed"), GROUPS, st.lists(st.sampled_from(sorted(PARENTS)))),
    ),
    max_size=40,
)


def chain(block: int | None):
    while block is not None:
        yield block
        block = PARENTS[block]


@given(OPERATIONS)
def test_the_index_holds_what_every_group_holds_whole(operations):
    hybrid = HybridBlocks()
    held: dict[int, set[int]] = {}
    index: set[int] = set()
    for kind, group, blocks in operations:
        if kind == "stored":
            held.setdefault(group, set()).add(blocks)
            events = hybrid.stored(group, [Stored([blocks], [blocks], parent=PARENTS[blocks])])
        else:
            held.get(group, set()).difference_update(blocks)
            events = hybrid.removed(group, blocks)
        for event in events:
            if isinstance(event, Stored):
                (block,) = event.block_ids
                assert event.parent is None or event.parent in index
                index.add(block)
            else:
                assert isinstance(event, Removed)
                index.difference_update(event.block_ids)
        whole = {
            block
            for block in PARENTS
            if held and all(a in g for g in held.values() for a in chain(block))
        }
        assert index == whole == hybrid.indexed
