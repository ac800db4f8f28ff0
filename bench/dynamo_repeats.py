"""How far Dynamo's KV router moves from run to run, and what that does to
the targets measured against it.

Dynamo's mocker in `kv_router` mode does not repeat itself: its router
breaks ties at random. Our replay repeats itself exactly for one seed. This
bench runs Dynamo's mocker `--repeats` times on each row (the Mooncake
trace and the generated workloads of bench/compare_generated.py, at each
worker count and arrival speed), our Dynamo-style cost `--our-repeats`
times, each breaking ties with its own seed, and kvrouter and the
any-router floor once. Per row it reports:

- the spread of Dynamo's mean TTFT over its repeats (largest over
  smallest), and whether every repeat lies within 3% of their median;
- our Dynamo-style cost's mean TTFT (the median of its repeats) over that
  median, and whether it lies within 3% of the median or inside the
  repeats' range;
- kvrouter's verdict (bench/compare_dynamo.py) against each repeat: how
  many repeats its mean TTFT goal and all five targets pass against.

Prints a table as it goes and writes bench/results/dynamo_repeats.json.
About 8 minutes for every row with 5 repeats; needs ai-dynamo-runtime
1.6.1. `--dynamo-runs PATH` takes Dynamo's repeats from an earlier report
of this bench instead of running them (about 5 minutes), to score another
build of ours against the same runs.

    PYTHONPATH=$PWD .venv/bin/python bench/dynamo_repeats.py [--repeats 5]
        [--workloads mooncake,mix,busy,agents,longdocs,tenants] [--seed 1]
        [--dynamo-runs bench/results/dynamo_repeats.json --output PATH] [--our-repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_dynamo  # noqa: E402
from compare_generated import WORKLOADS, workload_trace  # noqa: E402

from kvrouter.replay import load_mooncake  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "dynamo_repeats.json"
# The tolerance for the Dynamo-style cost against Dynamo's router.
TOLERANCE = 0.03


def row_report(
    trace: Path, workers: int, speed: float, runs: list[dict], our_repeats: int = 1
) -> dict:
    """One row against Dynamo's KV router `runs`: our Dynamo-style cost with
    `our_repeats` tie-breaking seeds, kvrouter and the floor once."""
    requests = load_mooncake(trace, speed)
    styles = [
        compare_dynamo.ours(requests, "dynamo", workers, seed=seed) for seed in range(our_repeats)
    ]
    # The run of the median mean TTFT (the upper one of an even count).
    dynamo_style = sorted(styles, key=lambda r: r["ttft_mean"])[len(styles) // 2]
    kvrouter = compare_dynamo.ours(requests, "kvrouter", workers)
    floor = compare_dynamo.reference(requests, workers)
    means = [run["ttft_mean"] for run in runs]
    median = statistics.median(means)
    ours = statistics.median(r["ttft_mean"] for r in styles)
    verdicts = [compare_dynamo.against(run, kvrouter, floor)["verdict"] for run in runs]
    return {
        "workers": workers,
        "speed": speed,
        "dynamo_kv_router": runs,
        "ours_dynamo": dynamo_style,
        "ours_dynamo_runs": styles,
        "ours_kvrouter": kvrouter,
        "any_router_floor": floor,
        "dynamo_spread": max(means) / min(means),
        "dynamo_within_tolerance": all(abs(m / median - 1) <= TOLERANCE for m in means),
        "ours_dynamo_over_median": ours / median,
        "ours_dynamo_within_tolerance": abs(ours / median - 1) <= TOLERANCE,
        "ours_dynamo_in_range": min(means) <= ours <= max(means),
        "kvrouter_ttft_goal_passes": sum(v["ttft_mean"] for v in verdicts),
        "kvrouter_all_five_passes": sum(all(v.values()) for v in verdicts),
    }


def line(name: str, row: dict) -> str:
    means = [run["ttft_mean"] for run in row["dynamo_kv_router"]]
    repeats = len(means)
    return (
        f"{name:<9} {row['workers']:>2}w@{row['speed']:g}x "
        f"{min(means):>9.0f}-{max(means):<9.0f} {row['dynamo_spread']:>7.3f} "
        f"{'yes' if row['dynamo_within_tolerance'] else 'NO':>6} "
        f"{row['ours_dynamo']['ttft_mean']:>9.0f} {row['ours_dynamo_over_median']:>7.3f} "
        f"{'yes' if row['ours_dynamo_within_tolerance'] else 'NO':>6} "
        f"{'yes' if row['ours_dynamo_in_range'] else 'no':>6} "
        f"{row['kvrouter_ttft_goal_passes']:>4}/{repeats} "
        f"{row['kvrouter_all_five_passes']:>6}/{repeats}"
    )


HEADER = (
    f"{'workload':<9} {'row':<6} {'Dynamo mean TTFT ms':>19} {'spread':>7} {'±3%':>6} "
    f"{'ours ms':>9} {'÷ med.':>7} {'±3%':>6} {'range':>6} {'goal':>6} {'all five':>8}"
)


def summary(rows: list[tuple[str, dict]]) -> str:
    n = len(rows)
    close = sum(r["ours_dynamo_within_tolerance"] or r["ours_dynamo_in_range"] for _, r in rows)
    steady = [r for _, r in rows if r["dynamo_within_tolerance"]]
    flips = [
        r
        for _, r in rows
        if 0 < r["kvrouter_all_five_passes"] < len(r["dynamo_kv_router"])
        or 0 < r["kvrouter_ttft_goal_passes"] < len(r["dynamo_kv_router"])
    ]
    return "\n".join(
        [
            f"rows whose Dynamo repeats all lie within 3% of their median: {len(steady)} of {n}",
            "our Dynamo-style cost within 3% of Dynamo's median: "
            f"{sum(r['ours_dynamo_within_tolerance'] for _, r in rows)} of {n} "
            f"({sum(r['ours_dynamo_within_tolerance'] for r in steady)} of the {len(steady)} "
            "steady rows)",
            f"  within 3% or inside Dynamo's own range: {close} of {n}",
            f"rows where kvrouter's verdict changes with the Dynamo repeat: {len(flips)} of {n}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="mooncake," + ",".join(WORKLOADS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", default="4,8,16")
    parser.add_argument("--speeds", default="1,2,3")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--dynamo-runs", type=Path, help="an earlier report's Dynamo repeats")
    parser.add_argument(
        "--our-repeats",
        type=int,
        default=1,
        help="replays of our Dynamo-style cost, each breaking ties with its own seed; "
        "the median is scored",
    )
    args = parser.parse_args(argv)
    if args.repeats < 2:
        parser.error("--repeats must be at least 2")
    earlier = {}
    if args.dynamo_runs:
        report = json.loads(args.dynamo_runs.read_text())
        if report["seed"] != args.seed:
            parser.error(f"{args.dynamo_runs} is of seed {report['seed']}, not {args.seed}")
        earlier = {
            (r["workload"], r["workers"], r["speed"]): r["dynamo_kv_router"] for r in report["rows"]
        }
    rows: list[tuple[str, dict]] = []
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.workloads.split(","):
            trace = workload_trace(name, args.seed, Path(tmp))
            for speed in [float(s) for s in args.speeds.split(",")]:
                for workers in [int(w) for w in args.workers.split(",")]:
                    key = (name, workers, speed)
                    if args.dynamo_runs and key not in earlier:
                        parser.error(f"{args.dynamo_runs} has no row {key}")
                    runs = earlier.get(key) or [
                        compare_dynamo.dynamo(trace, "kv_router", workers, speed)
                        for _ in range(args.repeats)
                    ]
                    row = row_report(trace, workers, speed, runs, args.our_repeats)
                    rows.append((name, row))
                    print(line(name, row), flush=True)
    text = summary(rows)
    print("\n" + text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "seed": args.seed,
        "repeats": len(rows[0][1]["dynamo_kv_router"]) if rows else args.repeats,
        "our_repeats": args.our_repeats,
        "dynamo_runs_from": str(args.dynamo_runs) if args.dynamo_runs else None,
        "tolerance": TOLERANCE,
        "rows": [{"workload": name, **row} for name, row in rows],
        "summary": text.splitlines(),
    }
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
