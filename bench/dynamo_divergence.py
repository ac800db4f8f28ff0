"""Where our Dynamo-style cost first parts from Dynamo's KV router, request
by request.

Runs one row (a generated workload of bench/compare_generated.py, or the
Mooncake trace) through Dynamo's mocker in `kv_router` mode with its
per-request capture, and through our replay under the `dynamo` baseline,
then lists the first requests, in arrival order, whose reused prompt tokens
differ, with what Dynamo's router saw for each: the overlap of the worker
it chose and the best overlap any worker offered. Worker numbers are not
compared: both break ties at random.

Prints the list and writes bench/results/dynamo_divergence.json; needs
ai-dynamo-runtime 1.6.1.

    PYTHONPATH=$PWD .venv/bin/python bench/dynamo_divergence.py --workload agents \\
        --workers 16 --speed 3 [--seed 1] [--first 12]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("DYN_LOG", "warn")

from compare_generated import workload_trace  # noqa: E402

from kvrouter.replay import ReplayConfig, load_mooncake, replay_requests  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "dynamo_divergence.json"


def dynamo_requests(trace: Path, workers: int, speed: float) -> list[dict]:
    from dynamo._core import run_mocker_trace_replay

    result = run_mocker_trace_replay(
        [str(trace)],
        num_workers=workers,
        router_mode="kv_router",
        arrival_speedup_ratio=speed,
        trace_block_size=512,
        capture_per_request=True,
    )
    return sorted(result.per_request, key=lambda r: (r["arrival_time_ms"], r["input_length"]))


def our_requests(trace: Path, workers: int, speed: float) -> list:
    """The replay's requests under the `dynamo` baseline, in arrival order."""
    requests = replay_requests(
        load_mooncake(trace, speed), "dynamo", ReplayConfig(num_workers=workers)
    )
    return sorted(requests, key=lambda r: (r.arrival, r.input_length))


def divergences(theirs: list[dict], ours: list, first: int) -> list[dict]:
    start = ours[0].arrival  # Dynamo counts from the first arrival
    out = []
    for number, (d, o) in enumerate(zip(theirs, ours, strict=True)):
        if abs(d["arrival_time_ms"] - (o.arrival - start)) > 1e-3:
            raise SystemExit(f"request {number}: the two runs disagree on the trace")
        if d["reused_input_tokens"] == o.reused:
            continue
        seen = d["routing_history"][0]
        out.append(
            {
                "request": number,
                "arrival_ms": d["arrival_time_ms"],
                "input_tokens": o.input_length,
                "dynamo_reused": d["reused_input_tokens"],
                "ours_reused": o.reused,
                "dynamo_chosen_overlap_blocks": seen["selected_overlap_blocks"],
                "dynamo_best_overlap_blocks": seen["best_available_overlap_blocks"],
                "dynamo_ttft_ms": d["ttft_ms"],
                "ours_ttft_ms": o.first_token - o.arrival,
            }
        )
        if len(out) == first:
            break
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="agents", help="mooncake or a generated one")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--speed", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--first", type=int, default=12)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trace = workload_trace(args.workload, args.seed, Path(tmp))
        theirs = dynamo_requests(trace, args.workers, args.speed)
        ours = our_requests(trace, args.workers, args.speed)
    rows = divergences(theirs, ours, args.first)
    reused = (sum(r["reused_input_tokens"] for r in theirs), sum(r.reused for r in ours))
    print(f"{args.workload}, {args.workers} workers, {args.speed:g}x: {len(theirs)} requests; "
          f"prompt tokens reused, Dynamo {reused[0]:,}, ours {reused[1]:,}")  # fmt: skip
    print(f"{'request':>7} {'at ms':>9} {'tokens':>7} {'reused D / ours':>17} "
          f"{'D chose / best overlap':>23} {'TTFT ms D / ours':>17}")  # fmt: skip
    for r in rows:
        print(
            f"{r['request']:>7} {r['arrival_ms']:>9.1f} {r['input_tokens']:>7} "
            f"{r['dynamo_reused']:>8} / {r['ours_reused']:<6} "
            f"{r['dynamo_chosen_overlap_blocks']:>12} / {r['dynamo_best_overlap_blocks']:<8} "
            f"{r['dynamo_ttft_ms']:>8.0f} / {r['ours_ttft_ms']:.0f}"
        )
    report = {
        "workload": args.workload,
        "workers": args.workers,
        "speed": args.speed,
        "seed": args.seed,
        "requests": len(theirs),
        "reused_tokens": {"dynamo": reused[0], "ours": reused[1]},
        "divergences": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
