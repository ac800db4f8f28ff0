"""The replay against Dynamo's mocker, request by request, on the small
cases bench/mocker_cases.py measured (tests/replay/mocker_cases.json): the
engine under round robin, and our `dynamo` baseline where the mocker ran
Dynamo's KV router."""

import json
from pathlib import Path

import pytest

from kvrouter.replay import ReplayConfig, replay
from kvrouter.replay.trace import TraceRequest

CASES = json.loads(Path(__file__).with_name("mocker_cases.json").read_text())
# Every case ends within 4e-5 ms of the mocker, 267 s runs included.
TOLERANCE = {"rel": 1e-6, "abs": 1e-3}
POLICIES = {"round_robin": "round_robin", "kv_router": "dynamo"}


def latencies(case: dict) -> tuple[list[float], list[float]]:
    """TTFT and end-to-end latency (ms) per request, ours then the mocker's,
    both ordered by TTFT, then end to end."""
    trace = [
        TraceRequest(r["timestamp"], r["input_length"], r["output_length"], tuple(r["hash_ids"]))
        for r in case["trace"]
    ]
    cfg = ReplayConfig(num_workers=case["workers"])
    if case["capacity_blocks"]:
        cfg.capacity_blocks = case["capacity_blocks"]
    report = replay(trace, POLICIES[case["router_mode"]], cfg)
    assert report["completed"] == len(trace)
    pairs = sorted(zip(report["ttft_samples_ms"], report["e2e_samples_ms"], strict=True))
    ours = [ms for pair in pairs for ms in pair]
    theirs = [ms for r in case["mocker"] for ms in (r["ttft_ms"], r["e2e_ms"])]
    return ours, theirs


@pytest.mark.parametrize("name", sorted(CASES["same_instant"]))
def test_requests_of_the_same_instant_share_an_iteration(name):
    ours, theirs = latencies(CASES["same_instant"][name])
    assert ours == pytest.approx(theirs, **TOLERANCE)


@pytest.mark.parametrize("name", sorted(CASES["iteration_priced_by_mean_chunk"]))
def test_an_iterations_prompts_are_priced_by_their_mean_length(name):
    ours, theirs = latencies(CASES["iteration_priced_by_mean_chunk"][name])
    assert ours == pytest.approx(theirs, **TOLERANCE)


@pytest.mark.parametrize("name", sorted(CASES["prefix_hits"]))
def test_a_fully_cached_prompt_computes_its_last_block(name):
    ours, theirs = latencies(CASES["prefix_hits"][name])
    assert ours == pytest.approx(theirs, **TOLERANCE)


@pytest.mark.parametrize("name", sorted(CASES["lru_order"]))
def test_released_output_blocks_are_evicted_in_their_turn(name):
    ours, theirs = latencies(CASES["lru_order"][name])
    assert ours == pytest.approx(theirs, **TOLERANCE)


@pytest.mark.parametrize("name", sorted(CASES["output_blocks"]))
def test_output_blocks_are_allocated_on_demand_and_preempt(name):
    ours, theirs = latencies(CASES["output_blocks"][name])
    assert ours == pytest.approx(theirs, **TOLERANCE)


@pytest.mark.parametrize("name", sorted(CASES["prompt_blocks_taken_at_admission"]))
def test_a_prompts_blocks_are_taken_whole_at_admission(name):
    ours, theirs = latencies(CASES["prompt_blocks_taken_at_admission"][name])
    assert ours == pytest.approx(theirs, **TOLERANCE)


@pytest.mark.parametrize("name", sorted(CASES["router_sees_a_chunk_once_computed"]))
def test_the_router_sees_a_prompts_blocks_chunk_by_chunk_once_computed(name):
    ours, theirs = latencies(CASES["router_sees_a_chunk_once_computed"][name])
    assert ours == pytest.approx(theirs, **TOLERANCE)
