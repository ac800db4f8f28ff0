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


# What each group of cases shows the replay doing as the mocker does.
BEHAVIOURS = {
    "same_instant": "requests of the same instant share an iteration",
    "iteration_priced_by_mean_chunk": "an iteration's prompts are priced by their mean length",
    "prefix_hits": "a fully cached prompt computes its last block",
    "lru_order": "released output blocks are evicted in their turn",
    "output_blocks": "output blocks are allocated on demand and preempt",
    "prompt_blocks_taken_at_admission": "a prompt's blocks are taken whole at admission",
    "router_sees_a_chunk_once_computed": (
        "the router sees a prompt's blocks chunk by chunk once computed"
    ),
}


def test_every_group_of_cases_states_its_behaviour():
    assert sorted(BEHAVIOURS) == sorted(CASES)


@pytest.mark.parametrize(
    ("group", "name"),
    [(group, name) for group in BEHAVIOURS for name in sorted(CASES[group])],
    ids=lambda value: value,
)
def test_the_replay_matches_the_mocker_case_by_case(group, name):
    ours, theirs = latencies(CASES[group][name])
    assert ours == pytest.approx(theirs, **TOLERANCE), BEHAVIOURS[group]
