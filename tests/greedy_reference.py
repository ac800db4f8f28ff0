"""Greedy tokens from a plain engine with no prefix cache: what every
serving path (workers, the router's proxy, the front door, the
engine-compatible mode) must reproduce for the same prompt."""

from __future__ import annotations

from collections.abc import Callable

from kvrouter.engine import EngineConfig, LLMEngine, SamplingParams


def greedy_reference(model) -> Callable[[list[int], int], list[int]]:
    """`generate(prompt, max_tokens)` on the checkpoint at `model`."""
    engine = LLMEngine(EngineConfig(model=str(model), enable_prefix_caching=False))

    def generate(prompt: list[int], max_tokens: int) -> list[int]:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        return engine.generate([prompt], params)[0].token_ids

    return generate
