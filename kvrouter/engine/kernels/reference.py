"""Plain torch implementations of the attention kernels.

They define what the Triton kernels must compute, and they are the CPU
backend. Scores and softmax run in fp32 whatever the cache dtype.

Cache layout, shared by every kernel: [num_blocks, block_size, num_kv_heads, head_dim].
Query head h reads KV head h // (num_heads // num_kv_heads), as in HF's repeat_kv.
"""

from __future__ import annotations

import torch


def write_kv_reference(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Stores key/value [T, num_kv_heads, head_dim] at their slots; slot -1 skips a token."""
    _, _, num_kv_heads, head_dim = k_cache.shape
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    k_cache.view(-1, num_kv_heads, head_dim)[slots] = key[valid]
    v_cache.view(-1, num_kv_heads, head_dim)[slots] = value[valid]


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, context_len: int) -> torch.Tensor:
    """The first `context_len` tokens of one sequence, [context_len, num_kv_heads, head_dim]."""
    block_size = cache.shape[1]
    num_blocks = -(-context_len // block_size)
    blocks = cache[block_table[:num_blocks].long()]
    return blocks.reshape(-1, *cache.shape[2:])[:context_len]


def causal_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention of the last len(query) positions of a sequence over all len(key)
    positions, causal. query [Lq, H, D], key/value [Lk, Hkv, D] -> [Lq, H, D]."""
    num_queries, num_heads, _ = query.shape
    num_keys, num_kv_heads, _ = key.shape
    group = num_heads // num_kv_heads
    q = query.float().transpose(0, 1)
    k = key.float().repeat_interleave(group, dim=1).transpose(0, 1)
    v = value.float().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = torch.matmul(q, k.transpose(1, 2)) * scale
    query_pos = torch.arange(num_keys - num_queries, num_keys, device=query.device)
    key_pos = torch.arange(num_keys, device=query.device)
    scores = scores.masked_fill(key_pos[None, :] > query_pos[:, None], float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), v)
    return out.transpose(0, 1).to(query.dtype)


def paged_decode_attention_reference(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence, at the last cached position. query [B, H, D]."""
    out = torch.empty_like(query)
    for i, context_len in enumerate(context_lens.tolist()):
        key = gather_kv(k_cache, block_tables[i], context_len)
        value = gather_kv(v_cache, block_tables[i], context_len)
        out[i] = causal_attention(query[i : i + 1], key, value, scale)[0]
    return out


def paged_prefill_attention_reference(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Each sequence's new tokens attend causally over its cached prefix and
    themselves; the new tokens' KV must already be written. query [T, H, D]."""
    out = torch.empty_like(query)
    starts = cu_seqlens_q.tolist()
    for i, context_len in enumerate(context_lens.tolist()):
        start, end = starts[i], starts[i + 1]
        key = gather_kv(k_cache, block_tables[i], context_len)
        value = gather_kv(v_cache, block_tables[i], context_len)
        out[start:end] = causal_attention(query[start:end], key, value, scale)
    return out
