"""Model and engine configuration.

`ModelConfig.from_hf` reads an HF `config.json` written by transformers 4.x
(`torch_dtype`, top-level `rope_theta`/`rope_scaling`) or 5.x (`dtype`,
`rope_parameters`), so checkpoints from either era load the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "llama3")

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"
    # llama3 frequency scaling; unused for "default".
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    rope: RopeConfig
    dtype: torch.dtype
    eos_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        return cls.from_hf(json.loads(Path(path).read_text()))

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            supported = ", ".join(SUPPORTED_MODEL_TYPES)
            raise ValueError(f"unsupported model_type {model_type!r}; supported: {supported}")
        num_heads = hf["num_attention_heads"]
        hidden_size = hf["hidden_size"]
        return cls(
            model_type=model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hidden_size,
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hidden_size // num_heads,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            # Qwen2 always has q/k/v biases; Llama has them only with attention_bias.
            qkv_bias=model_type == "qwen2" or hf.get("attention_bias", False),
            rope=_parse_rope(hf),
            dtype=_parse_dtype(hf),
            eos_token_ids=_parse_eos(hf.get("eos_token_id")),
        )


def _parse_eos(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, int) else tuple(value)


def _parse_dtype(hf: dict[str, Any]) -> torch.dtype:
    name = hf.get("dtype") or hf.get("torch_dtype") or "float32"
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; supported: {', '.join(_DTYPES)}")
    return _DTYPES[name]


def _parse_rope(hf: dict[str, Any]) -> RopeConfig:
    # 5.x folds theta and scaling into rope_parameters; 4.x keeps rope_theta at
    # the top level and scaling (if any) in rope_scaling.
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"unsupported rope type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return RopeConfig(theta=float(theta))
    return RopeConfig(
        theta=float(theta),
        rope_type=rope_type,
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
    )


@dataclass
class EngineConfig:
    """How one worker engine runs a model.

    `block_size` must equal the router's block size, because engine block ids
    are the router's chained block hashes.
    """

    model: str | Path
    block_size: int = 16
    num_kv_blocks: int = 256
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    # "torch" (reference kernels), "triton", or "auto" (triton on CUDA, torch elsewhere).
    attention_backend: str = "auto"
    device: str = "cpu"
    dtype: torch.dtype | None = None
    # Hash namespace: model name, LoRA adapter and cache salt, as the router sees them.
    namespace: str = ""
    tp_rank: int = 0
    tp_size: int = 1

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.num_kv_blocks <= 0:
            raise ValueError(f"num_kv_blocks must be positive, got {self.num_kv_blocks}")
        if self.max_num_seqs <= 0 or self.max_num_batched_tokens <= 0:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be positive")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(
                f"attention_backend must be auto, torch or triton, got {self.attention_backend!r}"
            )
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank {self.tp_rank} out of range for tp_size {self.tp_size}")
