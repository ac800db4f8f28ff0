"""Why kvrouter's p99 TTFT misses Dynamo's: what the policy weighed when it
placed the 1% of requests whose first token came last.

Replays kvrouter on every row of the verdict whose p99 TTFT is over
Dynamo's (or the rows given), keeping each decision's explanation, and
for the requests at or over the row's p99 TTFT compares the worker picked
with the candidate that predicted the fastest first token: how much later
the pick predicted this request's first token, how much of that was queue,
and how many ms of latency the fastest candidate's `stall` would have
added to the streams decoding there beyond the pick's. A pick that gives up
its own first token to spare more of the streams' time than it costs is
the cost's sum of latencies at work, not a misprediction.

    PYTHONPATH=$PWD .venv/bin/python bench/ttft_tail_decisions.py [--rows mix:4:3 ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_generated  # noqa: E402
from ttft_goal_misses import DEFAULT  # noqa: E402

from kvrouter.replay import load_mooncake  # noqa: E402
from kvrouter.replay.simulator import ReplayConfig, replay_requests  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "ttft_tail_decisions.json"


def p99_misses(paths: list[Path]) -> list[tuple[str, int, float]]:
    """(workload, workers, speed) of every verdict row whose p99 TTFT misses."""
    rows = []
    for path in paths:
        report = json.loads(path.read_text())
        for row in report["rows"]:
            target = report["targets"][f"{row['workers']}w@{row['speed']:g}x"]
            if not target["verdict"]["ttft_p99"]:
                rows.append((path.stem, row["workers"], row["speed"]))
    return rows


def tail_decisions(workload: str, workers: int, speed: float, seed: int, tmp: Path) -> dict:
    trace = load_mooncake(compare_generated.workload_trace(workload, seed, tmp), speed)
    explanations = {}

    def keep(request, decision) -> None:
        explanations[request.id] = decision.explanation

    requests = replay_requests(
        trace, "kvrouter", ReplayConfig(num_workers=workers, on_decision=keep)
    )
    ttfts = sorted(r.first_token - r.arrival for r in requests)
    p99 = ttfts[int(0.99 * len(ttfts))]
    later, queued, spared = [], [], []
    tail = [r for r in requests if r.first_token - r.arrival >= p99]
    for r in tail:
        explanation = explanations[r.id]
        pick = explanation.decode_candidate(r.decode_worker)
        fastest = min(explanation.decode_candidates, key=lambda c: c.ttft_ms)
        later.append(pick.ttft_ms - fastest.ttft_ms)
        queued.append(pick.queue_ms - fastest.queue_ms)
        spared.append(fastest.stall_ms - pick.stall_ms)
    return {
        "workload": workload,
        "workers": workers,
        "speed": speed,
        "p99_ttft_ms": p99,
        "tail": len(tail),
        "tail_cached": sum(r.reused > 0 for r in tail),
        "tail_not_fastest": sum(x > 0 for x in later),
        "ttft_over_fastest_ms_p50": statistics.median(later),
        "queue_over_fastest_ms_p50": statistics.median(queued),
        "stall_spared_ms_p50": statistics.median(spared),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows",
        nargs="*",
        metavar="WORKLOAD:WORKERS:SPEED",
        help="rows to replay (default: the verdict's rows whose p99 TTFT misses)",
    )
    parser.add_argument("--seed", type=int, default=1, help="the generated workloads' seed")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.rows:
        rows = [(w, int(n), float(s)) for w, n, s in (spec.split(":") for spec in args.rows)]
    else:
        rows = p99_misses(DEFAULT)
    print(
        f"{'row':<20} {'p99 ms':>7} {'tail':>4} {'cached':>6} {'not fastest':>11}"
        f" {'TTFT later':>10} {'queue':>6} {'stall spared':>12}"
    )
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for workload, workers, speed in rows:
            t = tail_decisions(workload, workers, speed, args.seed, Path(tmp))
            out.append(t)
            print(
                f"{workload} {workers}w@{speed:g}x".ljust(20)
                + f" {t['p99_ttft_ms']:>7.0f} {t['tail']:>4} {t['tail_cached']:>6}"
                f" {t['tail_not_fastest']:>11} {t['ttft_over_fastest_ms_p50']:>10.0f}"
                f" {t['queue_over_fastest_ms_p50']:>6.0f} {t['stall_spared_ms_p50']:>12.0f}",
                flush=True,
            )
    args.out.write_text(json.dumps({"seed": args.seed, "rows": out}, indent=2) + "\n")
    print(f"results in {args.out}")


if __name__ == "__main__":
    main()
