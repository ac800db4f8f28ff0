"""Per-request generation settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvrouter.sampling_rules import check_logprobs, check_sampling


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    # 0 means greedy.
    temperature: float = 0.0
    top_p: float = 1.0
    # 0 means no top-k cut.
    top_k: int = 0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    # None: no log probabilities; otherwise each generated token's, with
    # this many most likely alternatives (sampler.token_logprobs).
    logprobs: int | None = None

    def __post_init__(self) -> None:
        check_sampling(self.max_tokens, self.temperature, self.top_p, self.top_k)
        check_logprobs(self.logprobs)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
