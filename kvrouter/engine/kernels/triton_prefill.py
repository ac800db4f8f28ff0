"""Triton prefill attention over a paged cached prefix plus the new tokens.

Each program takes BLOCK_M new tokens of one sequence and one query head and
streams that sequence's KV from the paged cache (the new tokens' KV is
written first, so prefix and new tokens are read alike), flash-attention
style, stopping at the causal limit of its last row. Chunked prefill and
prefix-cache hits are the same case: a prefix already in the cache.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvrouter.engine.kernels.triton_common import (
    interpreting,
    launch_options,
    pad_pow2,
    upcast_dots,
)
from kvrouter.engine.kernels.triton_tiles import LOG2_E, attend_tile, load_kv_tile


@triton.jit
def _prefill_kernel(
    query_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    cu_seqlens_q_ptr,
    context_lens_ptr,
    out_ptr,
    scale_log2,
    query_stride_token,
    query_stride_head,
    out_stride_token,
    out_stride_head,
    block_tables_stride,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    seq = tl.program_id(0)
    query_block = tl.program_id(1)
    head = tl.program_id(2)
    query_start = tl.load(cu_seqlens_q_ptr + seq)
    query_len = tl.load(cu_seqlens_q_ptr + seq + 1) - query_start
    if query_block * BLOCK_M < query_len:
        context_len = tl.load(context_lens_ptr + seq)
        prefix_len = context_len - query_len
        kv_head = head // GROUP

        rows = query_block * BLOCK_M + tl.arange(0, BLOCK_M)
        row_mask = rows < query_len
        row_positions = prefix_len + rows
        dims = tl.arange(0, HEAD_DIM_PAD)
        dim_mask = dims < HEAD_DIM

        query = tl.load(
            query_ptr
            + (query_start + rows)[:, None] * query_stride_token
            + head * query_stride_head
            + dims[None, :],
            mask=row_mask[:, None] & dim_mask[None, :],
            other=0.0,
        )
        if UPCAST:
            query = query.to(tl.float32)

        row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
        # Keys past the last row's position are masked for every row: skip them.
        kv_end = tl.minimum(context_len, prefix_len + (query_block + 1) * BLOCK_M)
        for tile_start in range(0, kv_end, BLOCK_N):
            positions = tile_start + tl.arange(0, BLOCK_N)
            position_mask = positions < kv_end
            key, value = load_kv_tile(
                k_cache_ptr,
                v_cache_ptr,
                block_tables_ptr + seq * block_tables_stride,
                positions,
                position_mask,
                kv_head,
                dims,
                dim_mask,
                NUM_KV_HEADS,
                HEAD_DIM,
                PAGE_SIZE,
            )
            visible = position_mask[None, :] & (positions[None, :] <= row_positions[:, None])
            # Every row sees position 0 in the first tile, so row_max is finite from then on.
            row_max, row_sum, acc = attend_tile(
                query, key, value, visible, scale_log2, row_max, row_sum, acc, UPCAST
            )

        out = acc / row_sum[:, None]
        tl.store(
            out_ptr
            + (query_start + rows)[:, None] * out_stride_token
            + head * out_stride_head
            + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_mask[:, None] & dim_mask[None, :],
        )


def paged_prefill_attention_triton(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_query_len: int,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Same contract as `paged_prefill_attention_reference`. The optional
    arguments override the launch configuration (kernel_benchmark sweeps them)."""
    num_tokens, num_heads, head_dim = query.shape
    _, page_size, num_kv_heads, _ = k_cache.shape
    if query.stride(2) != 1:
        raise ValueError("query must be dense over head_dim")
    out = torch.empty(num_tokens, num_heads, head_dim, dtype=query.dtype, device=query.device)
    num_seqs = context_lens.numel()
    if num_tokens == 0:
        return out
    block_m = block_m or (16 if interpreting() else 64)
    block_n = block_n or (16 if interpreting() else 64)
    grid = (num_seqs, triton.cdiv(max_query_len, block_m), num_heads)
    _prefill_kernel[grid](
        query,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens_q,
        context_lens,
        out,
        scale * LOG2_E,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        NUM_KV_HEADS=num_kv_heads,
        GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=pad_pow2(head_dim),
        PAGE_SIZE=page_size,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        UPCAST=upcast_dots(k_cache.dtype),
        **launch_options(num_warps, num_stages),
    )
    return out
