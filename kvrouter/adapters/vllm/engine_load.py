"""An engine's load, read from its Prometheus `/metrics` text, as the
router's cost model takes it (`WorkerLoad`), per data-parallel rank.

- `active_requests`: running + waiting (vLLM `vllm:num_requests_running`
  and `vllm:num_requests_waiting`; SGLang `sglang:num_running_reqs` and
  `sglang:num_queue_reqs`);
- `queued_prefill_tokens`: waiting × the mean prompt so far (vLLM
  `vllm:request_prompt_tokens` sum / count; SGLang
  `sglang:prompt_tokens_total` / `sglang:num_requests_total`);
- `active_decode_blocks`: the KV cache's used fraction × its capacity
  (vLLM `vllm:kv_cache_usage_perc`, older `vllm:gpu_cache_usage_perc`;
  SGLang `sglang:token_usage`).

A series' DP rank is its `engine` label (vLLM) or `dp_rank` label
(SGLang); a series without one speaks for every rank of the engine. The
engines count waiting requests, not their tokens, so the queued prefill is
estimated from the mean prompt so far (0 before the first request)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from kvrouter.client.types import WorkerLoad

RANK_LABELS = ("engine", "dp_rank")


@dataclass(frozen=True)
class _Names:
    running: str
    waiting: str
    usage: tuple[str, ...]
    prompt_sum: str
    prompt_count: str


VLLM = _Names(
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    prompt_sum="vllm:request_prompt_tokens_sum",
    prompt_count="vllm:request_prompt_tokens_count",
)
SGLANG = _Names(
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    usage=("sglang:token_usage",),
    prompt_sum="sglang:prompt_tokens_total",
    prompt_count="sglang:num_requests_total",
)


def engine_loads(text: str, capacity_blocks: int) -> dict[int | None, WorkerLoad]:
    """Each DP rank's load (None: the series named no rank), from a
    `/metrics` page of vLLM or SGLang; empty when it has neither's gauges.
    ValueError for text that is not Prometheus' format."""
    values: dict[int | None, dict[str, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not math.isfinite(sample.value):
                continue
            rank = _rank(sample.labels)
            kept = values[rank]
            kept[sample.name] = kept.get(sample.name, 0.0) + sample.value
    names = next((n for n in (VLLM, SGLANG) if any(n.running in v for v in values.values())), None)
    if names is None:
        return {}
    return {
        rank: _load(names, kept, capacity_blocks)
        for rank, kept in values.items()
        if names.running in kept
    }


def _rank(labels: dict[str, str]) -> int | None:
    for name in RANK_LABELS:
        value = labels.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def _load(names: _Names, values: dict[str, float], capacity_blocks: int) -> WorkerLoad:
    running = max(0, round(values.get(names.running, 0.0)))
    waiting = max(0, round(values.get(names.waiting, 0.0)))
    count = values.get(names.prompt_count, 0.0)
    mean_prompt = values.get(names.prompt_sum, 0.0) / count if count > 0 else 0.0
    usage = next((values[n] for n in names.usage if n in values), 0.0)
    return WorkerLoad(
        queued_prefill_tokens=round(waiting * max(0.0, mean_prompt)),
        active_decode_blocks=round(min(1.0, max(0.0, usage)) * capacity_blocks),
        active_requests=running + waiting,
    )
