"""Self-attention over the paged KV cache."""

from __future__ import annotations

import torch
from torch import nn

from kvrouter.engine.config import ModelConfig
from kvrouter.engine.kernels.backend import AttentionBackend
from kvrouter.engine.kernels.metadata import AttentionMetadata
from kvrouter.engine.model.linear import ColumnParallelLinear, RowParallelLinear
from kvrouter.engine.model.rotary import RotaryEmbedding
from kvrouter.engine.parallel import TensorParallelGroup


class Attention(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        rotary: RotaryEmbedding,
        backend: AttentionBackend,
        tp: TensorParallelGroup,
    ) -> None:
        super().__init__()
        head_dim = config.head_dim
        self.num_heads = tp.shard(config.num_heads, "num_attention_heads")
        self.num_kv_heads = tp.shard(config.num_kv_heads, "num_key_value_heads")
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.qkv_proj = ColumnParallelLinear(
            config.hidden_size,
            [
                config.num_heads * head_dim,
                config.num_kv_heads * head_dim,
                config.num_kv_heads * head_dim,
            ],
            bias=config.qkv_bias,
            tp=tp,
        )
        self.o_proj = RowParallelLinear(config.num_heads * head_dim, config.hidden_size, False, tp)
        self.rotary = rotary
        self.backend = backend
        # This layer's slice of the paged cache; the model runner allocates and binds it.
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        query, key, value = self.qkv_proj(hidden).split([q_size, kv_size, kv_size], dim=-1)
        query = query.view(num_tokens, self.num_heads, self.head_dim)
        key = key.view(num_tokens, self.num_kv_heads, self.head_dim)
        value = value.view(num_tokens, self.num_kv_heads, self.head_dim)
        query, key = self.rotary(positions, query, key)

        self.backend.write_kv(key, value, self.k_cache, self.v_cache, metadata.slot_mapping)
        out = torch.empty_like(query)
        num_decode = metadata.num_decode_tokens
        if num_decode:
            out[:num_decode] = self.backend.decode(
                query[:num_decode], self.k_cache, self.v_cache, metadata, self.scale
            )
        if num_decode < num_tokens:
            out[num_decode:] = self.backend.prefill(
                query[num_decode:], self.k_cache, self.v_cache, metadata, self.scale
            )
        return self.o_proj(out.view(num_tokens, q_size))
