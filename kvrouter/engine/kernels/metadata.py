"""What the attention kernels need to know about one batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """A flat batch: decode tokens first (one per sequence), then the prefill
    chunks, each sequence's new tokens contiguous.

    Context lengths count every token whose KV is in the cache once this
    batch's keys and values are written, i.e. the cached prefix plus the new
    tokens.
    """

    # Cache slot (block * block_size + offset) for every token of the batch.
    slot_mapping: torch.Tensor
    num_decode_tokens: int
    decode_block_tables: torch.Tensor
    decode_context_lens: torch.Tensor
    decode_max_context_len: int
    prefill_block_tables: torch.Tensor
    prefill_context_lens: torch.Tensor
    # Query token offsets of each prefill sequence, length num_prefills + 1.
    prefill_cu_seqlens_q: torch.Tensor
    prefill_max_query_len: int
