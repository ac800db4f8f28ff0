"""Triton kernel: write new keys and values into the paged cache."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    key_stride,
    value_stride,
    ROW: tl.constexpr,
    ROW_PAD: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot >= 0:
        offsets = tl.arange(0, ROW_PAD)
        mask = offsets < ROW
        key = tl.load(key_ptr + token * key_stride + offsets, mask=mask)
        value = tl.load(value_ptr + token * value_stride + offsets, mask=mask)
        tl.store(k_cache_ptr + slot * ROW + offsets, key, mask=mask)
        tl.store(v_cache_ptr + slot * ROW + offsets, value, mask=mask)


def write_kv_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Same contract as `write_kv_reference`. key/value may be views into a
    fused QKV output: only their head and dim axes must be dense."""
    num_tokens, num_kv_heads, head_dim = key.shape
    row = num_kv_heads * head_dim
    for tensor in (key, value):
        if tensor.stride(2) != 1 or tensor.stride(1) != head_dim:
            raise ValueError("key and value must be dense over heads and head_dim")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the KV cache must be contiguous")
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        value.stride(0),
        ROW=row,
        ROW_PAD=triton.next_power_of_2(row),
    )
