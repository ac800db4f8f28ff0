"""The engine's model computes what HF transformers computes for the same
checkpoint: logits within 1e-4 in fp32, and the same greedy continuation.

The engine runs on CUDA where there is a GPU (its attention then defaults to
the Triton kernels) and on the CPU elsewhere; HF's model runs on the CPU."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kvrouter.engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint  # noqa: E402

CASES = {
    "llama-untied-transformers5": dict(model_type="llama", config_style="transformers5"),
    "llama-tied-transformers4": dict(
        model_type="llama", tie_word_embeddings=True, config_style="transformers4"
    ),
    "llama-llama3-rope-mha": dict(
        model_type="llama",
        num_kv_heads=4,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "qwen2-tied-transformers4": dict(
        model_type="qwen2", tie_word_embeddings=True, config_style="transformers4"
    ),
    "qwen2-untied-transformers5": dict(model_type="qwen2", num_kv_heads=1),
}


@pytest.fixture(params=sorted(CASES), scope="module")
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return write_tiny_checkpoint(path, seed=7, **CASES[request.param])


def hf_model(path):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def engine_for(path, **overrides) -> LLMEngine:
    return LLMEngine(
        EngineConfig(model=path, block_size=4, num_kv_blocks=32, device=DEVICE, **overrides)
    )


PROMPT = [3, 17, 250, 9, 41, 41, 8, 120, 77, 5, 64, 199, 2, 31, 90, 11, 16, 4, 222, 100]


def test_prompt_logits_match_hf(checkpoint):
    engine = engine_for(checkpoint)
    with torch.no_grad():
        expected = hf_model(checkpoint)(torch.tensor([PROMPT])).logits[0]
    actual = engine.prompt_logits(PROMPT).cpu()
    assert (actual - expected).abs().max().item() <= 1e-4


def test_greedy_continuation_matches_hf(checkpoint):
    engine = engine_for(checkpoint)
    [completion] = engine.generate([PROMPT], SamplingParams(max_tokens=12, ignore_eos=True))
    with torch.no_grad():
        generated = hf_model(checkpoint).generate(
            torch.tensor([PROMPT]),
            max_new_tokens=12,
            min_new_tokens=12,
            do_sample=False,
            pad_token_id=0,
        )
    assert completion.token_ids == generated[0, len(PROMPT) :].tolist()


def test_triton_backend_logits_match_hf(tmp_path):
    pytest.importorskip("triton")
    path = write_tiny_checkpoint(tmp_path, "qwen2", seed=3)
    engine = engine_for(path, attention_backend="triton")
    with torch.no_grad():
        expected = hf_model(path)(torch.tensor([PROMPT])).logits[0]
    assert (engine.prompt_logits(PROMPT).cpu() - expected).abs().max().item() <= 1e-4
