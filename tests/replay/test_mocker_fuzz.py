"""The replay against Dynamo's mocker on random small traces
(bench/mocker_fuzz.py, tests/replay/mocker_fuzz_cases.json): every request's
TTFT, end-to-end latency and reuse equal one of the outcomes the mocker gave
the trace in its runs (both break routing ties at random)."""

import json
from pathlib import Path

import pytest

from kvrouter.replay import ReplayConfig, TraceRequest, replay_requests

CASES = json.loads(Path(__file__).with_name("mocker_fuzz_cases.json").read_text())
POLICIES = {"round_robin": "round_robin", "kv_router": "dynamo"}


def ours(case: dict) -> list[tuple[float, float, int]]:
    speed = case["speed"]
    trace = [
        TraceRequest(
            r["timestamp"] / speed, r["input_length"], r["output_length"], tuple(r["hash_ids"])
        )
        for r in case["trace"]
    ]
    cfg = ReplayConfig(num_workers=case["workers"])
    if case["capacity_blocks"]:
        cfg.capacity_blocks = case["capacity_blocks"]
    done = sorted(
        replay_requests(trace, POLICIES[case["mode"]], cfg),
        key=lambda r: (r.arrival, r.input_length),
    )
    return [(r.first_token - r.arrival, r.done_at - r.arrival, r.reused) for r in done]


def matches(mine, outcome) -> bool:
    return all(
        x[0] == pytest.approx(y[0], rel=1e-4, abs=0.005)
        and x[1] == pytest.approx(y[1], rel=1e-4, abs=0.005)
        and x[2] == y[2]
        for x, y in zip(mine, outcome, strict=True)
    )


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c['mode']}-{c['speed']:g}x-seed{c['seed']}" for c in CASES]
)
def test_a_random_trace_replays_as_one_of_the_mockers_runs(case):
    mine = ours(case)
    assert any(matches(mine, outcome) for outcome in case["mocker"]), case["seed"]
