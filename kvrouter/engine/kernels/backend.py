"""Attention backends: the torch references or the Triton kernels."""

from __future__ import annotations

from typing import Protocol

import torch

from kvrouter.engine.kernels.metadata import AttentionMetadata
from kvrouter.engine.kernels.reference import (
    paged_decode_attention_reference,
    paged_prefill_attention_reference,
    write_kv_reference,
)


class AttentionBackend(Protocol):
    name: str

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None: ...

    def decode(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor: ...

    def prefill(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor: ...


class TorchAttentionBackend:
    name = "torch"

    def write_kv(self, key, value, k_cache, v_cache, slot_mapping) -> None:
        write_kv_reference(key, value, k_cache, v_cache, slot_mapping)

    def decode(self, query, k_cache, v_cache, metadata, scale) -> torch.Tensor:
        return paged_decode_attention_reference(
            query,
            k_cache,
            v_cache,
            metadata.decode_block_tables,
            metadata.decode_context_lens,
            scale,
        )

    def prefill(self, query, k_cache, v_cache, metadata, scale) -> torch.Tensor:
        return paged_prefill_attention_reference(
            query,
            k_cache,
            v_cache,
            metadata.prefill_block_tables,
            metadata.prefill_cu_seqlens_q,
            metadata.prefill_context_lens,
            scale,
        )


class TritonAttentionBackend:
    name = "triton"

    def __init__(self) -> None:
        # Imported here so the torch backend works where triton is absent.
        from kvrouter.engine.kernels.triton_decode import paged_decode_attention_triton
        from kvrouter.engine.kernels.triton_kv_write import write_kv_triton
        from kvrouter.engine.kernels.triton_prefill import paged_prefill_attention_triton

        self._write_kv = write_kv_triton
        self._decode = paged_decode_attention_triton
        self._prefill = paged_prefill_attention_triton

    def write_kv(self, key, value, k_cache, v_cache, slot_mapping) -> None:
        self._write_kv(key, value, k_cache, v_cache, slot_mapping)

    def decode(self, query, k_cache, v_cache, metadata, scale) -> torch.Tensor:
        return self._decode(
            query,
            k_cache,
            v_cache,
            metadata.decode_block_tables,
            metadata.decode_context_lens,
            scale,
            max_context_len=metadata.decode_max_context_len,
        )

    def prefill(self, query, k_cache, v_cache, metadata, scale) -> torch.Tensor:
        return self._prefill(
            query,
            k_cache,
            v_cache,
            metadata.prefill_block_tables,
            metadata.prefill_cu_seqlens_q,
            metadata.prefill_context_lens,
            scale,
            max_query_len=metadata.prefill_max_query_len,
        )


def select_backend(name: str, device: torch.device) -> AttentionBackend:
    """ "auto" means Triton on CUDA and torch elsewhere; Triton on CPU needs
    TRITON_INTERPRET=1 and is for testing only."""
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        return TorchAttentionBackend()
    if name == "triton":
        return TritonAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r}; use auto, torch or triton")
