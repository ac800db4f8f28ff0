"""Greedy tokens from a plain engine with no prefix cache: what every
serving path (workers, the router's proxy, the front door, the
engine-compatible mode) must reproduce for the same prompt."""

from __future__ import annotations

from collections.abc import Callable

from kvrouter.engine import EngineConfig, LLMEngine, SamplingParams
from kvrouter.engine.sampler import TokenLogprobs


def greedy_reference(model) -> Callable[[list[int], int], list[int]]:
    """`generate(prompt, max_tokens)` on the checkpoint at `model`."""
    scored = greedy_scored(model)
    return lambda prompt, max_tokens: scored(prompt, max_tokens)[0]


def greedy_scored(model) -> Callable[..., tuple[list[int], list[TokenLogprobs]]]:
    """`generate(prompt, max_tokens, logprobs=None)` on the checkpoint at
    `model`: the tokens, and with `logprobs` set, each token's log
    probabilities with that many most likely tokens'."""
    engine = LLMEngine(EngineConfig(model=str(model), enable_prefix_caching=False))

    def generate(prompt: list[int], max_tokens: int, logprobs: int | None = None):
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, logprobs=logprobs)
        completion = engine.generate([prompt], params)[0]
        return completion.token_ids, completion.logprobs

    return generate
