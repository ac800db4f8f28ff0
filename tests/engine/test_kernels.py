"""The Triton kernels compute what the torch references compute.

Without a GPU they run under TRITON_INTERPRET=1 (set in conftest.py), with
grids kept to a few dozen programs.
"""

import pytest
import torch

pytest.importorskip("triton")

from kvrouter.engine.kernels.reference import (  # noqa: E402
    paged_decode_attention_reference,
    paged_prefill_attention_reference,
    write_kv_reference,
)
from kvrouter.engine.kernels.triton_decode import (  # noqa: E402
    BATCHED_MIN_SEQS,
    paged_decode_attention_triton,
)
from kvrouter.engine.kernels.triton_kv_write import write_kv_triton  # noqa: E402
from kvrouter.engine.kernels.triton_prefill import paged_prefill_attention_triton  # noqa: E402

from .paged_inputs import random_paged_batch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 4, 2, 16, 4


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kv_write_matches_reference(dtype, generator):
    batch = random_paged_batch([9, 6], NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE, dtype, DEVICE, generator)
    # Keys and values as views into one fused projection output, as the model produces them.
    qkv = torch.randn(5, NUM_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM, generator=generator)
    qkv = qkv.to(dtype=dtype, device=DEVICE)
    key = qkv[:, NUM_HEADS : NUM_HEADS + NUM_KV_HEADS]
    value = qkv[:, NUM_HEADS + NUM_KV_HEADS :]
    slots = torch.tensor([3, 17, -1, 0, 22], device=DEVICE)

    expected_k, expected_v = batch.k_cache.clone(), batch.v_cache.clone()
    write_kv_reference(key, value, expected_k, expected_v, slots)
    write_kv_triton(key, value, batch.k_cache, batch.v_cache, slots)

    assert torch.equal(batch.k_cache, expected_k)
    assert torch.equal(batch.v_cache, expected_v)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize(
    "context_lens",
    # Context 1 leaves later splits empty; 21 crosses several pages and
    # tiles. The longer batch takes the batched launch on a GPU.
    [[1, 7, 21], [1, 7, 21, 40] + [3, 16, 33] * (BATCHED_MIN_SEQS // 3)],
    ids=["few seqs", "batched launch"],
)
def test_paged_decode_matches_reference(dtype, num_splits, context_lens, generator):
    batch = random_paged_batch(
        context_lens, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE, dtype, DEVICE, generator
    )
    query = torch.randn(len(context_lens), NUM_HEADS, HEAD_DIM, generator=generator)
    query = query.to(dtype=dtype, device=DEVICE)
    scale = HEAD_DIM**-0.5

    expected = paged_decode_attention_reference(
        query, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, scale
    )
    actual = paged_decode_attention_triton(
        query,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.context_lens,
        scale,
        max_context_len=max(context_lens),
        num_splits=num_splits,
    )
    torch.testing.assert_close(actual, expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_prefill_matches_reference(dtype, generator):
    # (new tokens, context): a fresh prompt, a chunk after a cached prefix,
    # a single new token, and a chunk spanning two query blocks.
    shapes = [(5, 5), (3, 12), (1, 9), (18, 21)]
    context_lens = [context for _, context in shapes]
    batch = random_paged_batch(
        context_lens, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE, dtype, DEVICE, generator
    )
    query_lens = [new for new, _ in shapes]
    cu_seqlens = torch.tensor([0] + query_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    query = torch.randn(sum(query_lens), NUM_HEADS, HEAD_DIM, generator=generator)
    query = query.to(dtype=dtype, device=DEVICE)
    scale = HEAD_DIM**-0.5
    cu_seqlens = cu_seqlens.to(DEVICE)

    expected = paged_prefill_attention_reference(
        query,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        cu_seqlens,
        batch.context_lens,
        scale,
    )
    actual = paged_prefill_attention_triton(
        query,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        cu_seqlens,
        batch.context_lens,
        scale,
        max_query_len=max(query_lens),
    )
    torch.testing.assert_close(actual, expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_reference_prefill_equals_dense_causal_attention(generator):
    """The reference itself: a whole prompt in one chunk is ordinary causal attention."""
    batch = random_paged_batch(
        [11], NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE, torch.float32, "cpu", generator
    )
    query = torch.randn(11, NUM_HEADS, HEAD_DIM, generator=generator)
    cu_seqlens = torch.tensor([0, 11], dtype=torch.int32)
    actual = paged_prefill_attention_reference(
        query,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        cu_seqlens,
        batch.context_lens,
        0.25,
    )
    pages = batch.block_tables[0, :3].long()
    key = batch.k_cache[pages].reshape(-1, NUM_KV_HEADS, HEAD_DIM)[:11]
    value = batch.v_cache[pages].reshape(-1, NUM_KV_HEADS, HEAD_DIM)[:11]
    expected = torch.nn.functional.scaled_dot_product_attention(
        query.transpose(0, 1),
        key.repeat_interleave(2, dim=1).transpose(0, 1),
        value.repeat_interleave(2, dim=1).transpose(0, 1),
        is_causal=True,
        scale=0.25,
    ).transpose(0, 1)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
