"""Triton paged decode attention: split-KV flash-decoding with GQA.

One query token per sequence. A decode batch is small (batch × KV heads
programs), too few to fill a GPU, so each sequence's context is cut into
splits processed in parallel; every split writes a partial output and its
log-sum-exp, and a second kernel merges the splits. One program serves all
query heads of a KV head, so each KV tile is read once per group instead of
once per query head.

Softmax runs in base 2 (exp2 with log2(e) folded into the scale); the
partial log-sum-exps are base 2 as well.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


@dataclass(frozen=True)
class DecodeLaunch:
    block_n: int
    num_warps: int | None = None
    num_stages: int | None = None


# From kernel_benchmark's sweep on an H200 (docs/benchmarks.md, "The engine
# on a GPU"): from 8 sequences up, 32-key tiles on 2 warps with 2 stages read
# KV fastest; one sequence reads faster with 64-key tiles. The interpreter
# takes 16-key tiles to keep its grids small.
BATCHED_MIN_SEQS = 8
BATCHED_LAUNCH = DecodeLaunch(block_n=32, num_warps=2, num_stages=2)
SINGLE_LAUNCH = DecodeLaunch(block_n=64)
INTERPRETER_LAUNCH = DecodeLaunch(block_n=16)


def resolve_launch(
    batch: int,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> DecodeLaunch:
    """The launch for a batch of `batch` sequences: each field given
    overrides the default's (Triton's own warps and stages where neither
    names them)."""
    if interpreting():
        default = INTERPRETER_LAUNCH
    else:
        default = BATCHED_LAUNCH if batch >= BATCHED_MIN_SEQS else SINGLE_LAUNCH
    return DecodeLaunch(
        block_n=block_n or default.block_n,
        num_warps=num_warps or default.num_warps,
        num_stages=num_stages or default.num_stages,
    )


@triton.jit
def _decode_split_kernel(
    query_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    scale_log2,
    tokens_per_split,
    query_stride_seq,
    query_stride_head,
    block_tables_stride,
    NUM_KV_HEADS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, context_len)

    group_offsets = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + group_offsets
    head_mask = group_offsets < GROUP
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_mask = dims < HEAD_DIM

    query = tl.load(
        query_ptr + seq * query_stride_seq + heads[:, None] * query_stride_head + dims[None, :],
        mask=head_mask[:, None] & dim_mask[None, :],
        other=0.0,
    )
    if UPCAST:
        query = query.to(tl.float32)

    row_max = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], dtype=tl.float32)
    for tile_start in range(start, end, BLOCK_N):
        positions = tile_start + tl.arange(0, BLOCK_N)
        position_mask = positions < end
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
        row_max, row_sum, acc = attend_tile(
            query, key, value, position_mask[None, :], scale_log2, row_max, row_sum, acc, UPCAST
        )

    # An empty split (past the end of a short context) contributes weight zero.
    has_tokens = row_sum > 0
    out = acc / tl.where(has_tokens, row_sum, 1.0)[:, None]
    lse = tl.where(has_tokens, row_max + tl.log2(tl.where(has_tokens, row_sum, 1.0)), float("-inf"))

    partial_row = (seq * NUM_KV_HEADS * GROUP + heads) * NUM_SPLITS + split
    tl.store(
        partial_out_ptr + partial_row[:, None] * HEAD_DIM + dims[None, :],
        out,
        mask=head_mask[:, None] & dim_mask[None, :],
    )
    tl.store(partial_lse_ptr + partial_row, lse, mask=head_mask)


@triton.jit
def _decode_merge_kernel(
    partial_out_ptr,
    partial_lse_ptr,
    out_ptr,
    out_stride_seq,
    out_stride_head,
    NUM_HEADS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    split_mask = splits < NUM_SPLITS
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_mask = dims < HEAD_DIM
    rows = (seq * NUM_HEADS + head) * NUM_SPLITS + splits
    lse = tl.load(partial_lse_ptr + rows, mask=split_mask, other=float("-inf"))
    weights = tl.exp2(lse - tl.max(lse, axis=0))
    partial = tl.load(
        partial_out_ptr + rows[:, None] * HEAD_DIM + dims[None, :],
        mask=split_mask[:, None] & dim_mask[None, :],
        other=0.0,
    )
    out = tl.sum(partial * weights[:, None], axis=0) / tl.sum(weights, axis=0)
    tl.store(
        out_ptr + seq * out_stride_seq + head * out_stride_head + dims,
        out.to(out_ptr.dtype.element_ty),
        mask=dim_mask,
    )


def choose_num_splits(
    device: torch.device,
    batch: int,
    num_kv_heads: int,
    max_context_len: int,
    block_n: int,
    programs_per_sm: int = 4,
) -> int:
    """Enough programs to fill the device (`programs_per_sm` per multiprocessor),
    without splits shorter than a few tiles."""
    if interpreting() or device.type != "cuda":
        return 1
    sm_count = torch.cuda.get_device_properties(device).multi_processor_count
    target_programs = programs_per_sm * sm_count
    wanted = math.ceil(target_programs / max(1, batch * num_kv_heads))
    longest_useful = math.ceil(max_context_len / (4 * block_n))
    return max(1, min(wanted, longest_useful, 64))


def paged_decode_attention_triton(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_context_len: int,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Same contract as `paged_decode_attention_reference`. The optional
    arguments override the launch, field by field (`resolve_launch`;
    kernel_benchmark sweeps them)."""
    batch, num_heads, head_dim = query.shape
    _, page_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    if query.stride(2) != 1:
        raise ValueError("query must be dense over head_dim")
    out = torch.empty(batch, num_heads, head_dim, dtype=query.dtype, device=query.device)
    if batch == 0:
        return out
    launch = resolve_launch(batch, block_n, num_warps, num_stages)
    block_n = launch.block_n
    if num_splits is None:
        num_splits = choose_num_splits(query.device, batch, num_kv_heads, max_context_len, block_n)
    tokens_per_split = math.ceil(max(1, max_context_len) / num_splits / block_n) * block_n
    partial_out = torch.empty(
        batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device
    )
    partial_lse = torch.empty(
        batch, num_heads, num_splits, dtype=torch.float32, device=query.device
    )
    head_dim_pad = pad_pow2(head_dim)
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        query,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        partial_out,
        partial_lse,
        scale * LOG2_E,
        tokens_per_split,
        query.stride(0),
        query.stride(1),
        block_tables.stride(0),
        NUM_KV_HEADS=num_kv_heads,
        NUM_SPLITS=num_splits,
        GROUP=group,
        GROUP_PAD=pad_pow2(group),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_pad,
        PAGE_SIZE=page_size,
        BLOCK_N=block_n,
        UPCAST=upcast_dots(k_cache.dtype),
        **launch_options(launch.num_warps, launch.num_stages),
    )
    _decode_merge_kernel[(batch, num_heads)](
        partial_out,
        partial_lse,
        out,
        out.stride(0),
        out.stride(1),
        NUM_HEADS=num_heads,
        NUM_SPLITS=num_splits,
        SPLITS_PAD=triton.next_power_of_2(num_splits),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_pad,
    )
    return out
