"""Can any policy meet the verdict's targets on a workload? Every policy of
the replay on one workload, scored as the verdict scores kvrouter, against
our Dynamo-style replay standing in for Dynamo's KV router.

The replay's `dynamo` baseline reproduces Dynamo's router (docs/routing.md,
"An iteration's chunks priced as the mocker prices them": within 3% of the
median of five Dynamo runs in every steady row), so the policies can be
compared on our replay alone, each with the same engine. For each row
(worker count and arrival speed) it prints, per policy, the ratios of mean
TTFT, p99 TTFT, mean ITL and mean end-to-end latency to the Dynamo-style
replay's, its reuse, and which of the five targets it would meet (reuse,
mean TTFT goal, p99 TTFT, ITL, end to end); the any-router floor's reuse
and TTFT set the goal as in bench/compare_dynamo.py. A row where no policy
meets the mean TTFT goal, not even the one that keeps every request with
its longest cached prefix (`overlap_only`), shows how far the goal is from
what placement alone gives there.

Prints a table and writes bench/results/policy_frontier_<workload>.json.

    PYTHONPATH=$PWD .venv/bin/python bench/policy_frontier.py --workload tenants \\
        [--seed 1] [--workers 4,8,16] [--speeds 1,2,3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_dynamo  # noqa: E402
from compare_generated import workload_trace  # noqa: E402

from kvrouter.policy import POLICIES  # noqa: E402
from kvrouter.replay import load_mooncake  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
TARGETS = ("reuse", "ttft_mean", "ttft_p99", "itl_mean", "e2e_mean")


def row(trace, workers: int) -> dict:
    """Every policy's figures and verdict against the Dynamo-style replay."""
    figures = {name: compare_dynamo.ours(trace, name, workers) for name in POLICIES}
    floor = compare_dynamo.reference(trace, workers)
    reference = figures["dynamo"]
    scored = {}
    for name, mine in figures.items():
        t = compare_dynamo.against(reference, mine, floor)
        scored[name] = {"figures": mine, **t}
    return {
        "goal": compare_dynamo.ttft_mean_goal(floor["ttft_mean"] / reference["ttft_mean"]),
        "any_router_floor": floor,
        "policies": scored,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="tenants", help="mooncake or a generated one")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", default="4,8,16")
    parser.add_argument("--speeds", default="1,2,3")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    output = args.output or RESULTS / f"policy_frontier_{args.workload}.json"
    rows = []
    print(
        f"{'row':<7} {'policy':<13} {'reuse':>6} {'TTFT x (goal)':>14} {'p99 x':>6} "
        f"{'ITL x':>6} {'e2e x':>6}  targets met"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = workload_trace(args.workload, args.seed, Path(tmp))
        for speed in [float(s) for s in args.speeds.split(",")]:
            trace = load_mooncake(path, speed)
            for workers in [int(w) for w in args.workers.split(",")]:
                r = row(trace, workers)
                name_row = f"{workers:>2}w@{speed:g}x"
                for name, p in r["policies"].items():
                    met = [k for k in TARGETS if p["verdict"][k]]
                    print(
                        f"{name_row} {name:<13} {p['figures']['reuse']:>6.1%} "
                        f"{p['ttft_mean_ratio']:>6.2f} ({r['goal']:.2f}) "
                        f"{p['ttft_p99_ratio']:>6.2f} {p['itl_mean_ratio']:>6.2f} "
                        f"{p['e2e_mean_ratio']:>6.2f}  {len(met)}: {', '.join(met)}"
                    )
                floor = r["any_router_floor"]
                floor_ratio = floor["ttft_mean"] / r["policies"]["dynamo"]["figures"]["ttft_mean"]
                print(f"{name_row} {'floor':<13} {floor['reuse']:>6.1%} {floor_ratio:>6.2f}")
                rows.append({"workers": workers, "speed": speed, **r})
    output.write_text(
        json.dumps({"workload": args.workload, "seed": args.seed, "rows": rows}, indent=1) + "\n"
    )
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
