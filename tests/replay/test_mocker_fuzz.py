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


def replayed(case: dict) -> list[tuple[float, float, int]]:
    pool = ReplayConfig(num_workers=case["workers"])
    if case["capacity_blocks"]:
        pool.capacity_blocks = case["capacity_blocks"]
    requests = replay_requests(
        [TraceRequest.from_record(r, case["speed"]) for r in case["trace"]],
        POLICIES[case["mode"]],
        pool,
    )
    # As the mocker's records are stored: by arrival, then prompt length.
    requests.sort(key=lambda r: (r.arrival, r.input_length))
    return [r.outcome() for r in requests]


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
    mine = replayed(case)
    assert any(matches(mine, outcome) for outcome in case["mocker"]), case["seed"]
