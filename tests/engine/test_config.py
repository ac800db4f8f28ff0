import json

import pytest
import torch

from kvrouter.engine.config import EngineConfig, ModelConfig
from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@pytest.mark.parametrize("rope_scaling", [None, LLAMA3_SCALING])
def test_transformers4_and_5_spellings_give_the_same_config(tmp_path, rope_scaling):
    configs = [
        ModelConfig.from_file(
            write_tiny_checkpoint(
                tmp_path / style,
                config_style=style,
                dtype="bfloat16",
                rope_theta=500000.0,
                rope_scaling=rope_scaling,
            )
            / "config.json"
        )
        for style in ("transformers4", "transformers5")
    ]
    assert configs[0] == configs[1]
    assert configs[0].dtype == torch.bfloat16
    assert configs[0].rope.theta == 500000.0
    assert configs[0].rope.rope_type == ("llama3" if rope_scaling else "default")


def test_qwen2_has_qkv_bias_and_llama_does_not(tmp_path):
    llama = ModelConfig.from_file(write_tiny_checkpoint(tmp_path / "l", "llama") / "config.json")
    qwen2 = ModelConfig.from_file(write_tiny_checkpoint(tmp_path / "q", "qwen2") / "config.json")
    assert not llama.qkv_bias and qwen2.qkv_bias


def test_defaults_for_optional_keys():
    config = ModelConfig.from_hf(
        {
            "model_type": "llama",
            "vocab_size": 10,
            "hidden_size": 8,
            "intermediate_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "eos_token_id": [2, 7],
        }
    )
    assert config.num_kv_heads == 2
    assert config.head_dim == 4
    assert config.rope.theta == 10000.0
    assert config.eos_token_ids == (2, 7)
    assert config.dtype == torch.float32


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "gpt2"}, "unsupported model_type"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}}, "unsupported rope type"),
        ({"dtype": "float8"}, "unsupported dtype"),
    ],
)
def test_unsupported_configs_are_rejected_clearly(tmp_path, change, message):
    path = write_tiny_checkpoint(tmp_path)
    hf = json.loads((path / "config.json").read_text())
    hf.update(change)
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf(hf)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size": 0},
        {"num_kv_blocks": 0},
        {"attention_backend": "cuda-graphs"},
        {"tp_rank": 2, "tp_size": 2},
    ],
)
def test_bad_engine_config_is_rejected(kwargs):
    with pytest.raises(ValueError):
        EngineConfig(model="unused", **kwargs)
