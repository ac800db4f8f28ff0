"""An engine's load and KV capacity, read from its Prometheus `/metrics`
text, per data-parallel rank.

The load, as the router's cost model takes it (`WorkerLoad`):
- `active_requests`: running + waiting (vLLM `vllm:num_requests_running`
  and `vllm:num_requests_waiting`; SGLang `sglang:num_running_reqs` and
  `sglang:num_queue_reqs`);
- `queued_prefill_tokens`: waiting × the mean prompt so far (vLLM
  `vllm:request_prompt_tokens` sum / count; SGLang
  `sglang:prompt_tokens_total` / `sglang:num_requests_total`);
- `active_decode_blocks`: the KV cache's used fraction × its capacity
  (vLLM `vllm:kv_cache_usage_perc`, older `vllm:gpu_cache_usage_perc`;
  SGLang `sglang:token_usage`).

The capacity of one DP engine, in tokens: vLLM states it in the labels of
its info gauge `vllm:cache_config_info`, one series per engine, as
`kv_cache_size_tokens` (a per-engine count, which allows for hybrid
models' cache groups; a front end serving several DP engines writes the
first one's on every series, their sizes being alike); before that label
existed, as `num_gpu_blocks` × `block_size`, where a front end serving
several DP engines sums their blocks, so that figure is divided among the
page's engines. SGLang states it as the gauge
`sglang:max_total_num_tokens`. A page that states none (an older engine,
or one still sizing its cache: `"None"`) has no capacity; a figure past
2^48 tokens is no engine's and is ignored.

A series' DP rank is its `engine` label (vLLM) or `dp_rank` label
(SGLang); a series without one speaks for every rank of the engine (SGLang
counts prompts in its tokenizer process, whose series name no rank). SGLang
with priority scheduling adds per-priority series (`priority="<n>"`) beside
the total (`priority=""`); only the total is read. The engines count
waiting requests, not their tokens, so the queued prefill is estimated from
the mean prompt so far (0 before the first request)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from kvrouter.client.types import WorkerLoad

RANK_LABELS = ("engine", "dp_rank")
VLLM_CACHE_CONFIG = "vllm:cache_config_info"
MAX_CAPACITY_TOKENS = 1 << 48
# Where a rank's stated capacity is kept among its values.
CAPACITY_TOKENS = "capacity_tokens"


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
SGLANG_CAPACITY = "sglang:max_total_num_tokens"
READ_SERIES = frozenset(
    name
    for names in (VLLM, SGLANG)
    for name in (names.running, names.waiting, *names.usage, names.prompt_sum, names.prompt_count)
) | {VLLM_CACHE_CONFIG, SGLANG_CAPACITY}


@dataclass(frozen=True)
class RankReading:
    """One DP rank's figures on an engine's page."""

    running: int
    waiting: int
    mean_prompt: float
    # The used fraction of its KV cache, 0 to 1.
    cache_usage: float
    # Its KV capacity in tokens, where the page states it.
    capacity_tokens: int | None

    def load(self, capacity_blocks: int) -> WorkerLoad:
        """The rank's load, its cache usage counted in `capacity_blocks`."""
        return WorkerLoad(
            queued_prefill_tokens=round(self.waiting * self.mean_prompt),
            active_decode_blocks=round(self.cache_usage * capacity_blocks),
            active_requests=self.running + self.waiting,
        )


def read_engine_page(text: str) -> dict[int | None, RankReading]:
    """Each DP rank's figures (None: the series named no rank), from a
    `/metrics` page of vLLM or SGLang; empty when it has neither's gauges.
    ValueError for a series it reads that is not in Prometheus' format."""
    values: dict[int | None, dict[str, float]] = defaultdict(dict)
    cache_configs: list[tuple[int | None, dict[str, str]]] = []
    for family in text_string_to_metric_families(_read_series(text)):
        for sample in family.samples:
            if not math.isfinite(sample.value) or sample.labels.get("priority"):
                continue
            rank = _rank(sample.labels)
            if sample.name == VLLM_CACHE_CONFIG:
                cache_configs.append((rank, sample.labels))
            elif sample.name == SGLANG_CAPACITY:
                _keep_capacity(values[rank], _stated(sample.value))
            else:
                values[rank][sample.name] = values[rank].get(sample.name, 0.0) + sample.value
    engines = max(1, len({rank for rank, _ in cache_configs}))
    for rank, labels in cache_configs:
        _keep_capacity(values[rank], _vllm_capacity(labels, engines))
    names = next((n for n in (VLLM, SGLANG) if any(n.running in v for v in values.values())), None)
    if names is None:
        return {}
    shared = values.get(None, {})
    return {
        rank: _reading(names, {**shared, **kept})
        for rank, kept in values.items()
        if names.running in kept
    }


def _read_series(text: str) -> str:
    """The page's lines of the series read here. A vLLM page is mostly
    histograms read by no one: parsing only these lines takes a tenth of
    the time, on the sidecar's event loop, at every probe."""
    return "\n".join(line for line in text.splitlines() if _series_name(line) in READ_SERIES)


def _series_name(line: str) -> str:
    return line.partition("{")[0].partition(" ")[0]


def _rank(labels: dict[str, str]) -> int | None:
    for name in RANK_LABELS:
        value = labels.get(name, "")
        if value.isdecimal():
            return int(value)
    return None


def _stated(value: str | float | None) -> int | None:
    """A positive count a page states (a label's decimal digits, or a
    sample's value), at most `MAX_CAPACITY_TOKENS`; None for anything else."""
    if isinstance(value, str):
        value = int(value) if value.isdecimal() else None
    if value is None or not 0 < value <= MAX_CAPACITY_TOKENS:
        return None
    return int(value)


def _keep_capacity(kept: dict[str, float], tokens: int | None) -> None:
    """Keeps the largest capacity any of a rank's series states: one pool
    per rank, whichever of its processes states it."""
    if tokens is not None:
        kept[CAPACITY_TOKENS] = max(kept.get(CAPACITY_TOKENS, 0), tokens)


def _vllm_capacity(labels: dict[str, str], engines: int) -> int | None:
    """One engine's KV tokens from a `vllm:cache_config_info` sample (see
    the module note), `engines` the page's count of them."""
    tokens = _stated(labels.get("kv_cache_size_tokens"))
    if tokens is not None:
        return tokens
    blocks, block_size = _stated(labels.get("num_gpu_blocks")), _stated(labels.get("block_size"))
    if blocks is None or block_size is None:
        return None
    return _stated(blocks * block_size // engines)


def _reading(names: _Names, values: dict[str, float]) -> RankReading:
    count = values.get(names.prompt_count, 0.0)
    usage = next((values[n] for n in names.usage if n in values), 0.0)
    capacity = values.get(CAPACITY_TOKENS)
    return RankReading(
        running=max(0, round(values.get(names.running, 0.0))),
        waiting=max(0, round(values.get(names.waiting, 0.0))),
        mean_prompt=max(0.0, values.get(names.prompt_sum, 0.0) / count) if count > 0 else 0.0,
        cache_usage=min(1.0, max(0.0, usage)),
        capacity_tokens=None if capacity is None else int(capacity),
    )
