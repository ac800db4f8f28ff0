"""The policy's P/D choices by replay: the Mooncake trace on separate
prefill and decode pools, at the default disaggregation thresholds, under
kvrouter's policy; mean and p99 TTFT, inter-token latency and end-to-end
latency, the share of requests split, and reuse.

The replay runs on a virtual clock, so the figures do not depend on the
machine's load, and two checkouts' runs compare exactly: run it once per
checkout with that checkout on PYTHONPATH and `--label`, then `--compare`
the two JSON files.

    PYTHONPATH=$PWD .venv/bin/python bench/replay_pd_policy.py --label now
    PYTHONPATH=../before .venv/bin/python bench/replay_pd_policy.py --label before
    .venv/bin/python bench/replay_pd_policy.py --compare before now
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared" / "traces" / "synthetic_trace.jsonl"
RESULTS = ROOT / "bench" / "results"
METRICS = ("ttft_ms", "itl_ms", "e2e_ms")


def run(args) -> dict:
    from kvrouter.replay.simulator import ReplayConfig, replay
    from kvrouter.replay.trace import load_mooncake

    rows = {}
    for pool in args.pools:
        for speed in args.speeds:
            config = ReplayConfig(num_workers=pool, num_prefill_workers=pool)
            result = replay(load_mooncake(args.trace, speed), "kvrouter", config)
            row = {m: {k: result[m][k] for k in ("mean", "p99")} for m in METRICS}
            row["split"] = result["disaggregated_fraction"]
            row["reuse"] = result["prefix_reuse_ratio"]
            rows[f"{pool}P+{pool}D {speed:g}x"] = row
            print(f"{pool}P+{pool}D {speed:g}x: {row}", flush=True)
    return {"trace": str(args.trace), "rows": rows}


def compare(before: dict, now: dict) -> str:
    """Each row's figures now, and as a ratio to before."""
    lines = [
        f"{'row':>14} | "
        + " | ".join(f"{m[:-3]:>4} mean, p99 (x before)" for m in METRICS)
        + " | split | reuse"
    ]
    for name, row in now["rows"].items():
        old = before["rows"][name]
        cells = [
            f"{row[m]['mean']:7.1f} ({row[m]['mean'] / old[m]['mean']:.2f}), "
            f"{row[m]['p99']:7.1f} ({row[m]['p99'] / old[m]['p99']:.2f})"
            for m in METRICS
        ]
        split = f"{row['split']:.0%} ({old['split']:.0%})"
        reuse = f"{row['reuse']:.1%} ({old['reuse']:.1%})"
        lines.append(f"{name:>14} | " + " | ".join(cells) + f" | {split} | {reuse}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--pools", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--speeds", type=float, nargs="+", default=[1.0, 2.0, 3.0])
    parser.add_argument("--label", default="now", help="names bench/results/replay_pd_LABEL.json")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "NOW"), help="two labels")
    args = parser.parse_args()
    if args.compare:
        before, now = (
            json.loads((RESULTS / f"replay_pd_{label}.json").read_text()) for label in args.compare
        )
        print(compare(before, now))
        return
    out = RESULTS / f"replay_pd_{args.label}.json"
    out.write_text(json.dumps(run(args), indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
