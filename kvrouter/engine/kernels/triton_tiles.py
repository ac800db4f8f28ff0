"""What the Triton attention kernels share: reading a tile of keys and values
from the paged cache, and folding it into a running softmax.

Softmax runs in base 2: scores are scaled by `scale * LOG2_E` and use exp2.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2_E = 1.4426950408889634


@triton.jit
def load_kv_tile(
    k_cache_ptr,
    v_cache_ptr,
    block_table_ptr,
    positions,
    position_mask,
    kv_head,
    dims,
    dim_mask,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
):
    """One KV head's keys and values at `positions` of the sequence whose
    block-table row starts at `block_table_ptr`; zero where masked."""
    pages = tl.load(block_table_ptr + positions // PAGE_SIZE, mask=position_mask, other=0)
    slots = pages.to(tl.int64) * PAGE_SIZE + positions % PAGE_SIZE
    kv_offsets = (slots[:, None] * NUM_KV_HEADS + kv_head) * HEAD_DIM + dims[None, :]
    kv_mask = position_mask[:, None] & dim_mask[None, :]
    key = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
    value = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
    return key, value


@triton.jit
def attend_tile(
    query,
    key,
    value,
    visible,
    scale_log2,
    row_max,
    row_sum,
    acc,
    UPCAST: tl.constexpr,
):
    """One flash-attention step: the query rows' scores against the tile's
    keys (those not `visible` count for nothing), folded into the running
    max, sum and output. Returns the new (row_max, row_sum, acc)."""
    if UPCAST:
        key = key.to(tl.float32)
        value = value.to(tl.float32)
        scores = tl.dot(query, tl.trans(key), input_precision="ieee")
    else:
        scores = tl.dot(query, tl.trans(key))
    scores = tl.where(visible, scores * scale_log2, float("-inf"))
    new_max = tl.maximum(row_max, tl.max(scores, axis=1))
    probs = tl.exp2(scores - new_max[:, None])
    rescale = tl.exp2(row_max - new_max)
    row_sum = row_sum * rescale + tl.sum(probs, axis=1)
    if UPCAST:
        acc = acc * rescale[:, None] + tl.dot(probs, value, input_precision="ieee")
    else:
        acc = acc * rescale[:, None] + tl.dot(probs.to(value.dtype), value)
    return new_max, row_sum, acc
