"""ChainNamespaces against a plain dict per worker, over random operations:
a block's namespace is known from its storing until its removal or its
worker's clearing, and never for another worker."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvrouter.adapters.vllm.chains import ChainNamespaces

WORKERS = st.integers(0, 2)
BLOCKS = st.integers(0, 7)
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("stored"), WORKERS, BLOCKS, st.sampled_from(["a", "b"])),
        st.tuples(st.just("removed"), WORKERS, st.lists(BLOCKS, max_size=4)),
        st.tuples(st.just("forget"), WORKERS),
    ),
    max_size=40,
)


@given(OPERATIONS)
def test_a_blocks_namespace_lasts_from_its_storing_to_its_removal(operations):
    chains = ChainNamespaces()
    model: dict[int, dict[int, str]] = {}
    for operation in operations:
        kind, worker, *rest = operation
        if kind == "stored":
            block, namespace = rest
            chains.stored(worker, block, namespace)
            model.setdefault(worker, {})[block] = namespace
        elif kind == "removed":
            (blocks,) = rest
            chains.removed(worker, blocks)
            for block in blocks:
                model.get(worker, {}).pop(block, None)
        else:
            chains.forget(worker)
            model.pop(worker, None)
        for w in range(3):
            for block in range(8):
                assert chains.of(w, block) == model.get(w, {}).get(block)
            assert chains.of(w, None) is None
