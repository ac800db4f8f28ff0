"""The sidecar's reading of an engine's `/metrics` page as the router's
load figures and each rank's KV capacity: on the page vLLM 0.33's own
Prometheus logger wrote (scripts/capture_engine_metrics.py; the state it
recorded beside it), and on a page with SGLang 0.5's series names and
labels."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvrouter.adapters.vllm.engine_load import read_engine_page
from kvrouter.client.types import WorkerLoad

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CAPACITY = 1000

# SGLang 0.5.23's collectors (srt/observability/metrics_collector.py): the
# scheduler's series carry tp/pp/ep ranks and dp_rank, with priority
# scheduling a total under priority="" and a series per priority; the
# tokenizer process counts prompts and requests with no rank.
SCHEDULER_LABELS = 'engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"'


def scheduler(name: str, rank: int, value: float, priority: str | None = None) -> str:
    labels = f'dp_rank="{rank}",{SCHEDULER_LABELS}'
    if priority is not None:
        labels += f',priority="{priority}"'
    return f"{name}{{{labels}}} {value}"


SGLANG_PAGE = "\n".join(
    [
        "# TYPE sglang:num_running_reqs gauge",
        scheduler("sglang:num_running_reqs", 0, 4.0, ""),
        scheduler("sglang:num_running_reqs", 0, 4.0, "1"),
        scheduler("sglang:num_running_reqs", 1, 0.0, ""),
        "# TYPE sglang:num_queue_reqs gauge",
        scheduler("sglang:num_queue_reqs", 0, 2.0, ""),
        scheduler("sglang:num_queue_reqs", 0, 2.0, "1"),
        scheduler("sglang:num_queue_reqs", 1, 1.0, ""),
        # Written once at startup (`SchedulerMetricsCollector.emit_constants`).
        "# TYPE sglang:max_total_num_tokens gauge",
        scheduler("sglang:max_total_num_tokens", 0, 471258.0),
        scheduler("sglang:max_total_num_tokens", 1, 471258.0),
        "# TYPE sglang:token_usage gauge",
        scheduler("sglang:token_usage", 0, 0.4),
        scheduler("sglang:token_usage", 1, 0.1),
        "# TYPE sglang:prompt_tokens counter",
        'sglang:prompt_tokens_total{model_name="m"} 6000.0',
        "# TYPE sglang:num_requests counter",
        'sglang:num_requests_total{model_name="m"} 20.0',
        "",
    ]
)


def engine_loads(text: str, capacity_blocks: int) -> dict[int | None, WorkerLoad]:
    """Each rank's load on a page, its cache usage counted in `capacity_blocks`."""
    return {rank: r.load(capacity_blocks) for rank, r in read_engine_page(text).items()}


def test_vllms_own_page_reads_as_each_ranks_load():
    page = FIXTURES / "vllm-0.33.0-metrics.txt"
    recorded = json.loads(Path(f"{page}.json").read_text())
    loads = engine_loads(page.read_text(), CAPACITY)
    assert set(loads) == {int(rank) for rank in recorded}
    for rank, state in recorded.items():
        waiting = state["waiting"] + state["deferred"]
        mean_prompt = sum(state["prompts"]) / len(state["prompts"])
        assert loads[int(rank)] == WorkerLoad(
            queued_prefill_tokens=round(waiting * mean_prompt),
            active_decode_blocks=round(state["kv_cache_usage"] * CAPACITY),
            active_requests=state["running"] + waiting,
        )


def test_sglangs_page_reads_totals_per_rank_with_the_shared_prompt_mean():
    loads = engine_loads(SGLANG_PAGE, CAPACITY)
    assert loads == {
        0: WorkerLoad(queued_prefill_tokens=600, active_decode_blocks=400, active_requests=6),
        1: WorkerLoad(queued_prefill_tokens=300, active_decode_blocks=100, active_requests=1),
    }


def test_a_page_of_neither_engine_is_no_load():
    assert engine_loads("# TYPE x gauge\nx 1.0\n", CAPACITY) == {}


def test_vllms_own_page_states_each_engines_kv_capacity():
    """Two DP engines behind one front end: each reads as its own tokens
    (`kv_cache_size_tokens`), not as the blocks the front end sums."""
    page = FIXTURES / "vllm-0.33.0-metrics.txt"
    recorded = json.loads(Path(f"{page}.json").read_text())
    readings = read_engine_page(page.read_text())
    for rank, state in recorded.items():
        assert readings[int(rank)].capacity_tokens == state["kv_cache_size_tokens"]


def test_without_the_tokens_label_the_summed_blocks_are_shared_among_the_engines():
    """A vLLM that states only `num_gpu_blocks`, summed over its DP engines."""
    page = FIXTURES / "vllm-0.33.0-metrics.txt"
    recorded = json.loads(Path(f"{page}.json").read_text())
    state = recorded["0"]
    text = page.read_text().replace(
        f'kv_cache_size_tokens="{state["kv_cache_size_tokens"]}"', 'kv_cache_size_tokens="None"'
    )
    per_engine = state["num_gpu_blocks"] * state["block_size"] // len(recorded)
    assert {r.capacity_tokens for r in read_engine_page(text).values()} == {per_engine}


@pytest.mark.parametrize(
    "stated", ["None", "0", "-5", "1.5", "²", "99999999999999999999", "kv", ""]
)
def test_a_vllm_engine_stating_no_usable_capacity_has_none(stated):
    """Still sizing its cache (`"None"`), or a garbled page: no capacity,
    and the rest of the page still reads."""
    page = FIXTURES / "vllm-0.33.0-metrics.txt"
    text = re.sub(
        r'(kv_cache_size_tokens|num_gpu_blocks)="\d+"', rf'\1="{stated}"', page.read_text()
    )
    readings = read_engine_page(text)
    assert {r.capacity_tokens for r in readings.values()} == {None}
    assert {r.running for r in readings.values()} == {3, 1}


def test_sglangs_page_states_each_ranks_capacity_in_tokens():
    readings = read_engine_page(SGLANG_PAGE)
    assert {rank: r.capacity_tokens for rank, r in readings.items()} == {0: 471258, 1: 471258}


def test_a_garbled_series_the_sidecar_does_not_read_leaves_the_rest_of_the_page_read():
    """Only the series above are parsed: one line of a histogram no one
    reads, garbled, does not cost the ranks their load."""
    page = FIXTURES / "vllm-0.33.0-metrics.txt"
    lines = page.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("vllm:iteration_tokens_total_"))
    lines[at] = "vllm:iteration_tokens_total_bucket{le=0.5 garbled"
    readings = read_engine_page("\n".join(lines))
    assert {r.running for r in readings.values()} == {3, 1}
