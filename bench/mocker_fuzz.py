"""The replay against Dynamo's mocker (ai-dynamo-runtime 1.6.1) on random
small traces, request by request: the engine under round robin, and our
`dynamo` baseline where the mocker runs Dynamo's KV router.

Each trace has 4 to 14 requests on 2 or 3 workers, drawn from a few prefix
families (so prompts share prefixes), with gaps from 0 to 1,000 ms (so
requests share milliseconds and iterations), outputs of 2 to 800 tokens
and KV caches of 512 to 2,048 blocks or the default (so caches fill,
evict and preempt). Both break routing ties at random, so the mocker runs
a trace up to `--runs` times: the trace matches when our replay gives
every request the TTFT and end-to-end latency of one of those runs, within
0.005 ms or 1e-4, and its reused tokens exactly. A trace that matches none
is listed by its seed.

Prints a table and writes bench/results/mocker_fuzz.json; with `--fixture`
it also writes tests/replay/mocker_fuzz_cases.json (the traces that match,
each with every outcome the mocker gave in all of its runs), which
tests/replay/test_mocker_fuzz.py replays without Dynamo.

    .venv/bin/python bench/mocker_fuzz.py [--traces 300] [--runs 8] [--speeds 1,3] [--fixture 40]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("DYN_LOG", "warn")

from mocker_cases import BLOCK, mocker_requests  # noqa: E402

from kvrouter.replay import ReplayConfig, TraceRequest, replay_requests  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "mocker_fuzz.json"
FIXTURE = HERE.parent / "tests" / "replay" / "mocker_fuzz_cases.json"
POLICIES = {"round_robin": "round_robin", "kv_router": "dynamo"}


def random_case(seed: int) -> dict:
    """A small trace and the pool it runs on, the same for the same seed."""
    rng = random.Random(seed)
    families = [
        [rng.randrange(10**6) for _ in range(rng.randint(1, 30))] for _ in range(rng.randint(2, 6))
    ]
    at = 0
    requests = []
    for _ in range(rng.randint(4, 14)):
        at += rng.choice([0, 0, 1, 5, 20, 50, 100, 300, 1000])
        family = rng.choice(families)
        ids = family[: rng.randint(1, len(family))]
        ids += [rng.randrange(10**6, 2 * 10**6) for _ in range(rng.randint(0, 6))]
        requests.append(
            {
                "timestamp": at,
                "input_length": (len(ids) - 1) * BLOCK + rng.randint(1, BLOCK),
                "output_length": rng.choice([2, 10, 50, 200, 800]),
                "hash_ids": ids,
            }
        )
    return {
        "seed": seed,
        "workers": rng.choice([2, 3]),
        "capacity_blocks": rng.choice([None, 512, 1024, 2048]),
        "trace": requests,
    }


def ours(case: dict, mode: str, speed: float) -> list[tuple[float, float, int]]:
    """(TTFT ms, end-to-end ms, reused tokens) per request, arrival order."""
    cfg = ReplayConfig(num_workers=case["workers"])
    cfg.capacity_blocks = case["capacity_blocks"] or cfg.capacity_blocks
    trace = [TraceRequest.from_record(r, speed) for r in case["trace"]]
    done = replay_requests(trace, POLICIES[mode], cfg)
    # The mocker's order: by arrival, then prompt length.
    return [r.outcome() for r in sorted(done, key=lambda r: (r.arrival, r.input_length))]


def theirs(case: dict, mode: str, speed: float) -> list[list[float]]:
    runs = mocker_requests(case["workers"], case["capacity_blocks"], case["trace"], mode, speed)
    return [[r["ttft_ms"], r["e2e_latency_ms"], r["reused_input_tokens"]] for r in runs]


def same(a: list[list[float]], b: list[list[float]]) -> bool:
    """Every request's latencies within 0.005 ms or 1e-4, its reuse exact."""
    return all(
        abs(x[0] - y[0]) <= max(0.005, 1e-4 * y[0])
        and abs(x[1] - y[1]) <= max(0.005, 1e-4 * y[1])
        and x[2] == y[2]
        for x, y in zip(a, b, strict=True)
    )


def outcomes(case: dict, mode: str, speed: float, runs: int, want=None) -> list:
    """The distinct outcomes of up to `runs` mocker runs; stops at the first
    that is `same` as `want` when given."""
    seen: list = []
    for _ in range(runs):
        got = theirs(case, mode, speed)
        if not any(same(got, s) for s in seen):
            seen.append(got)
        if want is not None and same(want, got):
            break
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=int, default=300)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=8, help="mocker runs a trace at most")
    parser.add_argument("--speeds", default="1,3", help="arrival speed-ups")
    parser.add_argument("--modes", default="round_robin,kv_router")
    parser.add_argument("--fixture", type=int, default=0, help="write this many traces a row")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    rows, fixture = [], []
    print(
        f"{'mode':12} {'speed':>5} {'traces':>6} {'first run':>9} {'any run':>7}  unmatched seeds"
    )
    for mode in args.modes.split(","):
        for speed in (float(s) for s in args.speeds.split(",")):
            first = matched = 0
            unmatched, kept = [], 0
            for seed in range(args.first_seed, args.first_seed + args.traces):
                case = random_case(seed)
                mine = ours(case, mode, speed)
                keep = kept < args.fixture
                seen = outcomes(case, mode, speed, args.runs, want=None if keep else mine)
                hit = [same(mine, s) for s in seen]
                first += hit[0]
                if any(hit):
                    matched += 1
                    if keep:
                        fixture.append(dict(case, mode=mode, speed=speed, mocker=seen))
                        kept += 1
                else:
                    unmatched.append(seed)
            rows.append(
                {
                    "mode": mode,
                    "speed": speed,
                    "traces": args.traces,
                    "matched_first_run": first,
                    "matched_any_run": matched,
                    "unmatched_seeds": unmatched,
                }
            )
            print(f"{mode:12} {speed:5g} {args.traces:6d} {first:9d} {matched:7d}  {unmatched}")
    args.output.write_text(json.dumps({"runs": args.runs, "rows": rows}, indent=1) + "\n")
    if args.fixture:
        FIXTURE.write_text(json.dumps(fixture, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
