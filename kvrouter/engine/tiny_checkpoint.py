"""Small random-weight Llama/Qwen2 checkpoints, for tests and demos where no
real weights can be downloaded. They use the HF layout (config.json, sharded
safetensors with an index, and the tokenizer files of
`kvrouter.engine.tiny_tokenizer`), so HF transformers loads them too."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from kvrouter.engine.tiny_tokenizer import write_tiny_tokenizer

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def write_tiny_checkpoint(
    path: str | Path,
    model_type: str = "llama",
    *,
    vocab_size: int = 256,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    tie_word_embeddings: bool = False,
    rope_theta: float = 10000.0,
    rope_scaling: dict | None = None,
    max_position_embeddings: int = 2048,
    dtype: str = "float32",
    config_style: str = "transformers5",
    seed: int = 0,
) -> Path:
    """Writes config.json, two safetensors shards and the tokenizer files
    into `path`; the tokenizer's ids are below `vocab_size`.

    `config_style` picks the config spelling: "transformers5" (`dtype`,
    `rope_parameters`) or "transformers4" (`torch_dtype`, top-level
    `rope_theta` and `rope_scaling`).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    head_dim = hidden_size // num_heads
    config = {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if config_style == "transformers5":
        config["dtype"] = dtype
        config["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": rope_theta,
            **(rope_scaling or {}),
        }
    elif config_style == "transformers4":
        config["torch_dtype"] = dtype
        config["rope_theta"] = rope_theta
        config["rope_scaling"] = rope_scaling
    else:
        raise ValueError(
            f"config_style must be transformers4 or transformers5, got {config_style!r}"
        )
    (path / "config.json").write_text(json.dumps(config, indent=2))

    generator = torch.Generator().manual_seed(seed)

    def weight(rows: int, cols: int) -> torch.Tensor:
        # 1/sqrt(fan_in) keeps activations O(1), so logits are spread out and
        # greedy decoding has no near-ties.
        return torch.randn(rows, cols, generator=generator) / math.sqrt(cols)

    def norm() -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(hidden_size, generator=generator)

    torch_dtype = getattr(torch, dtype)
    shards: list[dict[str, torch.Tensor]] = [{}, {}]
    shards[0]["model.embed_tokens.weight"] = torch.randn(
        vocab_size, hidden_size, generator=generator
    )
    for layer in range(num_layers):
        shard = shards[0] if layer < num_layers // 2 else shards[1]
        prefix = f"model.layers.{layer}"
        shard[f"{prefix}.input_layernorm.weight"] = norm()
        shard[f"{prefix}.post_attention_layernorm.weight"] = norm()
        shard[f"{prefix}.self_attn.q_proj.weight"] = weight(num_heads * head_dim, hidden_size)
        shard[f"{prefix}.self_attn.k_proj.weight"] = weight(num_kv_heads * head_dim, hidden_size)
        shard[f"{prefix}.self_attn.v_proj.weight"] = weight(num_kv_heads * head_dim, hidden_size)
        shard[f"{prefix}.self_attn.o_proj.weight"] = weight(hidden_size, num_heads * head_dim)
        if model_type == "qwen2":
            for name, size in (("q", num_heads), ("k", num_kv_heads), ("v", num_kv_heads)):
                bias = 0.1 * torch.randn(size * head_dim, generator=generator)
                shard[f"{prefix}.self_attn.{name}_proj.bias"] = bias
        shard[f"{prefix}.mlp.gate_proj.weight"] = weight(intermediate_size, hidden_size)
        shard[f"{prefix}.mlp.up_proj.weight"] = weight(intermediate_size, hidden_size)
        shard[f"{prefix}.mlp.down_proj.weight"] = weight(hidden_size, intermediate_size)
    shards[1]["model.norm.weight"] = norm()
    if not tie_word_embeddings:
        shards[1]["lm_head.weight"] = weight(vocab_size, hidden_size)

    weight_map = {}
    total_size = 0
    for index, shard in enumerate(shards):
        file_name = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        shard = {name: tensor.to(torch_dtype).contiguous() for name, tensor in shard.items()}
        save_file(shard, path / file_name, metadata={"format": "pt"})
        for name, tensor in shard.items():
            weight_map[name] = file_name
            total_size += tensor.numel() * tensor.element_size()
    index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    write_tiny_tokenizer(path, vocab_size, max_position_embeddings)
    return path
