"""The Llama/Qwen2 decoder-only transformer.

Module names follow the HF checkpoints (model.layers.N.self_attn..., lm_head)
except for the fused projections, which the loader fills from the separate
q/k/v and gate/up tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvrouter.engine.config import ModelConfig
from kvrouter.engine.kernels.backend import AttentionBackend
from kvrouter.engine.kernels.metadata import AttentionMetadata
from kvrouter.engine.model.attention import Attention
from kvrouter.engine.model.linear import ColumnParallelLinear, RowParallelLinear
from kvrouter.engine.model.norm import RMSNorm
from kvrouter.engine.model.rotary import RotaryEmbedding
from kvrouter.engine.parallel import TensorParallelGroup


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, tp: TensorParallelGroup) -> None:
        super().__init__()
        size = config.intermediate_size
        self.gate_up_proj = ColumnParallelLinear(config.hidden_size, [size, size], False, tp)
        self.down_proj = RowParallelLinear(size, config.hidden_size, False, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        rotary: RotaryEmbedding,
        backend: AttentionBackend,
        tp: TensorParallelGroup,
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, rotary, backend, tp)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config, tp)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        hidden = hidden + self.self_attn(positions, self.input_layernorm(hidden), metadata)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DecoderModel(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        backend: AttentionBackend,
        tp: TensorParallelGroup,
        max_positions: int,
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        rotary = RotaryEmbedding(config.rope, config.head_dim, max_positions)
        self.layers = nn.ModuleList(
            DecoderLayer(config, rotary, backend, tp) for _ in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden = layer(positions, hidden, metadata)
        return self.norm(hidden)


class CausalLM(nn.Module):
    """Embedding and LM head are replicated on every rank: only attention and
    MLP are sharded."""

    def __init__(
        self,
        config: ModelConfig,
        backend: AttentionBackend,
        tp: TensorParallelGroup,
        max_positions: int,
    ) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderModel(config, backend, tp, max_positions)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        return self.model(input_ids, positions, metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
