"""Random paged KV caches and batches for the kernel tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor


def random_paged_batch(
    context_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype: torch.dtype,
    device: str,
    generator: torch.Generator,
) -> PagedBatch:
    """A cache filled with random values whose sequences own shuffled,
    non-contiguous pages, so a kernel that ignores the block table fails."""
    pages_per_seq = [-(-n // page_size) for n in context_lens]
    num_pages = sum(pages_per_seq) + 3
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=generator).to(dtype=dtype, device=device)
    v_cache = torch.randn(shape, generator=generator).to(dtype=dtype, device=device)
    order = torch.randperm(num_pages, generator=generator)
    width = max(pages_per_seq)
    block_tables = torch.zeros(len(context_lens), width, dtype=torch.int32)
    taken = 0
    for i, count in enumerate(pages_per_seq):
        block_tables[i, :count] = order[taken : taken + count]
        taken += count
    return PagedBatch(
        k_cache,
        v_cache,
        block_tables.to(device),
        torch.tensor(context_lens, dtype=torch.int32, device=device),
    )
