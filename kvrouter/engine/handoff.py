"""KV blocks in transit between workers (prefill worker -> decode worker).

Only full blocks travel, named by their router block hashes; the receiver
recomputes the hashes from the request's tokens before trusting them, so a
peer with another namespace or block size cannot poison the cache. The
receiver computes the partial last block itself (fewer than block_size
tokens), which is cheaper than a second transfer round.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class KvLayout:
    """What must match between exporter and importer for the bytes to mean the same."""

    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: str

    @property
    def block_shape(self) -> tuple[int, ...]:
        return (2, self.num_layers, self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def bytes_per_block(self) -> int:
        numel = 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim
        return numel * _DTYPES[self.dtype].itemsize

    @classmethod
    def of(cls, data: torch.Tensor) -> KvLayout:
        _, num_layers, _, block_size, num_kv_heads, head_dim = data.shape
        dtype = str(data.dtype).removeprefix("torch.")
        return cls(num_layers, block_size, num_kv_heads, head_dim, dtype)


@dataclass
class KvBlocks:
    """Consecutive blocks of one sequence; `data` is
    [2 (K, V), num_layers, num_blocks, block_size, num_kv_heads, head_dim]."""

    block_ids: list[int]
    data: torch.Tensor

    @property
    def layout(self) -> KvLayout:
        return KvLayout.of(self.data)

    def to_bytes(self) -> bytes:
        return self.data.contiguous().cpu().view(torch.uint8).numpy().tobytes()

    @classmethod
    def from_bytes(cls, block_ids: list[int], payload: bytes, layout: KvLayout) -> KvBlocks:
        expected = len(block_ids) * layout.bytes_per_block
        if len(payload) != expected:
            raise ValueError(
                f"KV payload has {len(payload)} bytes; "
                f"{len(block_ids)} blocks of {layout} need {expected}"
            )
        raw = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        two, num_layers, block_size, heads, head_dim = layout.block_shape
        data = raw.view(_DTYPES[layout.dtype]).view(
            two, num_layers, len(block_ids), block_size, heads, head_dim
        )
        return cls(list(block_ids), data)
