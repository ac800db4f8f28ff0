"""The rule for a request's sampling settings, written once: the router
checks it before routing, the worker before scheduling, and the engine's
SamplingParams on construction. A ValueError names the field."""

from __future__ import annotations

import math

# Above 0 (greedy) and below this, logits / temperature can overflow to inf
# and the softmax turn to NaN (vLLM raises smaller temperatures to this).
MIN_TEMPERATURE = 1e-2
# The most alternatives a request may ask log probabilities for (vLLM's
# default max_logprobs, and OpenAI's top_logprobs limit).
MAX_LOGPROBS = 20


def check_sampling(max_tokens: int, temperature: float, top_p: float, top_k: int) -> None:
    if max_tokens < 1:
        raise ValueError(f"sampling.max_tokens must be at least 1, got {max_tokens}")
    if not (temperature == 0 or (math.isfinite(temperature) and temperature >= MIN_TEMPERATURE)):
        raise ValueError(
            f"sampling.temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE}, "
            f"got {temperature}"
        )
    if not 0 < top_p <= 1:
        raise ValueError(f"sampling.top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"sampling.top_k must be >= 0, got {top_k}")


def check_logprobs(logprobs: int | None) -> None:
    """None asks for no log probabilities; 0 for the chosen token's only."""
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise ValueError(f"sampling.logprobs must be in [0, {MAX_LOGPROBS}], got {logprobs}")


def wire_top_p(top_p: float) -> float:
    """kvrouter.v1's top_p, where 0 (the unset default) means no nucleus cut."""
    return 1.0 if top_p == 0 else top_p
