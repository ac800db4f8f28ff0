"""A request's state as it moves through the scheduler."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from kvrouter.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from kvrouter.engine.sampler import TokenLogprobs


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestTimings:
    """Monotonic timestamps (seconds) and the latencies the router calibrates on."""

    arrival: float = field(default_factory=time.monotonic)
    first_scheduled: float | None = None
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished: float | None = None

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled is None else self.first_scheduled - self.arrival

    @property
    def prefill_time(self) -> float | None:
        if self.first_token is None or self.first_scheduled is None:
            return None
        return self.first_token - self.first_scheduled

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def inter_token_latencies(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)]

    @property
    def mean_itl(self) -> float | None:
        gaps = self.inter_token_latencies
        return sum(gaps) / len(gaps) if gaps else None


class Sequence:
    def __init__(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> None:
        if not prompt_token_ids:
            raise ValueError("the prompt must hold at least one token")
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.status = SequenceStatus.WAITING
        # Physical KV blocks, in sequence order.
        self.block_table: list[int] = []
        # Router hashes of the leading full blocks already registered or hit.
        self.block_hashes: list[int] = []
        # Tokens whose KV is in the cache.
        self.num_computed_tokens = 0
        # Prompt tokens served from the prefix cache at first admission.
        self.num_cached_tokens = 0
        # Prompt tokens the prefix cache held when it arrived; the load report
        # does not count them as waiting work.
        self.num_cached_on_arrival = 0
        self.num_preemptions = 0
        self.finish_reason: str | None = None
        # Why this sequence alone failed (finish reason "error"), e.g. its sampling.
        self.failure: str | None = None
        self.timings = RequestTimings()
        self.generator: torch.Generator | None = None
        # One per output token when `params.logprobs` is set; empty otherwise.
        self.output_logprobs: list[TokenLogprobs] = []

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED
