"""Chooses the disaggregation thresholds by replay.

Replays the Mooncake trace in P/D mode (prefill and decode pools) under
kvrouter's policy for each pair of thresholds, `local_prefill_max_tokens`
(prefill on the decode worker when its cache leaves this few tokens to
compute) and `prefill_saturation_ms` (or when the least-queued prefill worker
has this much work queued), at two arrival speeds, and prints mean and p99
TTFT and the share of requests split. The defaults in
kvrouter/policy/config.py are the pair with the lowest mean TTFT summed over
both speeds.

    .venv/bin/python bench/replay_pd_sweep.py        # about 2 minutes
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from kvrouter.policy import PolicyConfig
from kvrouter.replay.simulator import ReplayConfig, replay
from kvrouter.replay.trace import load_mooncake

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared" / "traces" / "synthetic_trace.jsonl"
LOCAL_PREFILL_MAX_TOKENS = (0, 512, 1024, 2048, 4096, 8192, 16384)
PREFILL_SATURATION_MS = (125.0, 250.0, 500.0, 1000.0, 2000.0)
SPEEDS = (1.0, 2.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(TRACE))
    parser.add_argument("--prefill-workers", type=int, default=4)
    parser.add_argument("--decode-workers", type=int, default=4)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "replay_pd_sweep.json"))
    args = parser.parse_args()

    traces = {speed: load_mooncake(args.trace, speed) for speed in SPEEDS}
    grid = list(itertools.product(LOCAL_PREFILL_MAX_TOKENS, PREFILL_SATURATION_MS))
    rows = []
    for local, saturation in tqdm(grid, desc="thresholds"):
        policy = replace(
            PolicyConfig(), local_prefill_max_tokens=local, prefill_saturation_ms=saturation
        )
        config = ReplayConfig(
            num_workers=args.decode_workers,
            num_prefill_workers=args.prefill_workers,
            policy_config=policy,
        )
        row = {"local_prefill_max_tokens": local, "prefill_saturation_ms": saturation}
        for speed, trace in traces.items():
            result = replay(trace, "kvrouter", config)
            row[f"{speed:g}x"] = {
                "ttft_mean_ms": result["ttft_ms"]["mean"],
                "ttft_p99_ms": result["ttft_ms"]["p99"],
                "itl_p99_ms": result["itl_ms"]["p99"],
                "split": result["disaggregated_fraction"],
                "reuse": result["prefix_reuse_ratio"],
            }
        row["score"] = sum(row[f"{speed:g}x"]["ttft_mean_ms"] for speed in SPEEDS)
        rows.append(row)
    rows.sort(key=lambda r: r["score"])
    header = f"{'local max':>9} {'saturation':>10} | " + " | ".join(
        f"{f'{s:g}x':>4} TTFT mean / p99 ms, ITL p99, split" for s in SPEEDS
    )
    print(header)
    for r in rows:
        cells = " | ".join(
            f"{r[f'{s:g}x']['ttft_mean_ms']:>14.0f} / {r[f'{s:g}x']['ttft_p99_ms']:>5.0f}, "
            f"{r[f'{s:g}x']['itl_p99_ms']:>7.1f}, {r[f'{s:g}x']['split']:>4.0%}"
            for s in SPEEDS
        )
        print(f"{r['local_prefill_max_tokens']:>9} {r['prefill_saturation_ms']:>10.0f} | {cells}")
    best = rows[0]
    print(
        f"best: local_prefill_max_tokens={best['local_prefill_max_tokens']}, "
        f"prefill_saturation_ms={best['prefill_saturation_ms']:g}"
    )
    Path(args.out).write_text(json.dumps({"trace": args.trace, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
