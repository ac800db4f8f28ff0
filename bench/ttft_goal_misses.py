"""Where kvrouter misses the mean-TTFT goal against Dynamo's KV router, is
it short of reuse or does it queue?

Reads results of `compare_generated.py`, `compare_dynamo.py` or
`rescore_kvrouter.py` (no replay is run) and, for every row whose mean
TTFT misses the goal, splits kvrouter's TTFT in two: its TTFT had each
prefill run alone with the hits it got (`ttft_alone`: what its
placements' reuse allows), and the rest (queueing and batching behind
other requests). A row whose TTFT alone is already over the goal cannot
meet it by queueing less: it needs more reuse; a row under it misses by
queueing.

    PYTHONPATH=$PWD .venv/bin/python bench/ttft_goal_misses.py [RESULTS.json ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_dynamo import ttft_mean_goal  # noqa: E402

# The verdict docs/routing.md gives: kvrouter's replay of the current policy
# scored against the Dynamo run of the seed-1 workloads and the Mooncake trace.
VERDICT = Path(__file__).resolve().parent / "results" / "rescored_batch_pricing"
DEFAULT = [
    VERDICT / f"{w}.json" for w in ("mix", "busy", "agents", "longdocs", "tenants", "mooncake")
]


def misses(path: Path) -> list[dict]:
    """The rows of one results file whose verdict misses the mean-TTFT goal."""
    report = json.loads(path.read_text())
    out = []
    for row in report["rows"]:
        target = report["targets"][f"{row['workers']}w@{row['speed']:g}x"]
        if target["verdict"]["ttft_mean"]:
            continue
        mine, floor = row["ours_kvrouter"], row["any_router_floor"]
        goal = ttft_mean_goal(target["floor_ttft_mean_ratio"])
        alone = mine["ttft_alone_mean"] / row["dynamo_kv_router"]["ttft_mean"]
        out.append(
            {
                "results": path.stem,
                "workers": row["workers"],
                "speed": row["speed"],
                "ratio": target["ttft_mean_ratio"],
                "goal": goal,
                "alone_ratio": alone,
                "queueing_share": 1 - mine["ttft_alone_mean"] / mine["ttft_mean"],
                "reuse": mine["reuse"],
                "floor_reuse": floor["reuse"],
                "dynamo_reuse": row["dynamo_kv_router"]["reuse"],
                "short_of": "reuse" if alone > goal else "queueing",
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="*", type=Path, default=DEFAULT)
    args = parser.parse_args()
    rows = [m for path in args.results for m in misses(path)]
    print(
        f"{'results':<28} {'row':<9} {'TTFT x':>6} {'goal':>5} {'alone x':>7} {'queued':>6}"
        f" {'reuse':>6} {'floor':>6} {'Dynamo':>6}  short of"
    )
    for m in rows:
        print(
            f"{m['results']:<28} {m['workers']}w@{m['speed']:g}x".ljust(38)
            + f" {m['ratio']:>6.2f} {m['goal']:>5.2f} {m['alone_ratio']:>7.2f}"
            f" {m['queueing_share']:>6.0%} {m['reuse']:>6.1%} {m['floor_reuse']:>6.1%}"
            f" {m['dynamo_reuse']:>6.1%}  {m['short_of']}"
        )
    by_cause = {cause: sum(m["short_of"] == cause for m in rows) for cause in ("reuse", "queueing")}
    print(f"{len(rows)} rows miss the goal: {by_cause['reuse']} short of reuse,"
          f" {by_cause['queueing']} by queueing")  # fmt: skip


if __name__ == "__main__":
    main()
