"""Workers started for real on 127.0.0.1 (free ports), each on an event loop
of its own thread, with no router; and a plain engine as the reference."""

from __future__ import annotations

import pytest
from threaded_worker import started_workers

from kvrouter.engine import EngineConfig, LLMEngine, SamplingParams
from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"), "llama", seed=3)


@pytest.fixture
def start_worker(tiny_model):
    yield from started_workers(str(tiny_model), num_kv_blocks=128, torch_threads=0)


@pytest.fixture(scope="session")
def reference(tiny_model):
    """Greedy tokens from a plain engine with no prefix cache: what every
    serving path must reproduce."""
    engine = LLMEngine(EngineConfig(model=str(tiny_model), enable_prefix_caching=False))

    def generate(prompt: list[int], max_tokens: int) -> list[int]:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        return engine.generate([prompt], params)[0].token_ids

    return generate
