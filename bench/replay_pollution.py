"""Cache-pollution pricing on and off, in the replay: kvrouter's policy with
`pollution_weight` 0 (no pricing, the default) and 1, on the same traces,
worker counts and speeds, in one run.

Workloads:
- hot_and_one_off: a few long hot prompts that come back every few
  seconds among many short one-off prompts that never do, on caches of
  128k tokens: where the one-offs land decides whether the hot prompts
  survive (docs/routing.md, "Cache pollution");
- mix and tenants: bench/compare_generated.py's generated workloads;
- mooncake: ../shared/traces/synthetic_trace.jsonl (with --mooncake).

Prints a table (reuse, TTFT mean and p99, ITL and end-to-end means, busy
time imbalance; each "on" figure beside its "off" one) and writes
bench/results/replay_pollution.json.

    .venv/bin/python bench/replay_pollution.py [--workers 4,8] [--speeds 1]
        [--workloads hot_and_one_off,mix,tenants] [--mooncake PATH]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_generated import WORKLOADS  # noqa: E402

from kvrouter.policy import PolicyConfig  # noqa: E402
from kvrouter.replay.simulator import ReplayConfig, replay  # noqa: E402
from kvrouter.replay.synthetic import generate  # noqa: E402
from kvrouter.replay.trace import TraceRequest, load_mooncake  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "replay_pollution.json"
TRACE_BLOCK_SIZE = 512
# hot_and_one_off: each worker holds this many 64-token blocks (128k tokens).
SMALL_CACHE_BLOCKS = 2048


def hot_and_one_off(num_requests: int = 6000, seed: int = 0) -> list[TraceRequest]:
    """3 hot prompts of 32k tokens, each back about every 10 s, among 30
    one-off prompts of 2k tokens a second that never come back: per worker
    the one-offs turn a cache over faster than the hot prompts return,
    unless they are kept away from the workers that hold them. At most
    about 14% of the prompt tokens can hit."""
    rng = random.Random(seed)
    hot_blocks, one_off_blocks = 64, 4  # of 512 tokens
    hot_rate, one_off_rate = 0.3, 30.0
    hot = [tuple(range(i * hot_blocks, (i + 1) * hot_blocks)) for i in range(3)]
    next_id = len(hot) * hot_blocks
    out, t = [], 0.0
    for _ in range(num_requests):
        t += rng.expovariate(hot_rate + one_off_rate) * 1000
        if rng.random() < hot_rate / (hot_rate + one_off_rate):
            ids = rng.choice(hot)
        else:
            ids = tuple(range(next_id, next_id + one_off_blocks))
            next_id += one_off_blocks
        out.append(TraceRequest(t, len(ids) * TRACE_BLOCK_SIZE, rng.randint(20, 100), ids))
    return out


def trace_of(name: str, args) -> tuple[list[TraceRequest], int]:
    """The workload's requests and the cache size (blocks a worker) to replay it with."""
    if name == "hot_and_one_off":
        return hot_and_one_off(), SMALL_CACHE_BLOCKS
    if name == "mooncake":
        return load_mooncake(args.mooncake), ReplayConfig.capacity_blocks
    return generate(WORKLOADS[name], seed=1), ReplayConfig.capacity_blocks


def sped_up(trace: list[TraceRequest], speed: float) -> list[TraceRequest]:
    return [
        TraceRequest(r.arrival_ms / speed, r.input_length, r.output_length, r.hash_ids)
        for r in trace
    ]


def row(report: dict) -> dict:
    return {
        "reuse": report["prefix_reuse_ratio"],
        "ttft_mean_ms": report["ttft_ms"]["mean"],
        "ttft_p99_ms": report["ttft_ms"]["p99"],
        "itl_mean_ms": report["itl_ms"]["mean"],
        "e2e_mean_ms": report["e2e_ms"]["mean"],
        "busy_imbalance": report["imbalance"]["busy_time"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="hot_and_one_off,mix,tenants")
    parser.add_argument("--mooncake", type=Path, help="also replay this Mooncake trace")
    parser.add_argument("--workers", default="4,8")
    parser.add_argument("--speeds", default="1")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    names = args.workloads.split(",") + (["mooncake"] if args.mooncake else [])
    rows = []
    print(
        f"{'workload':<16} {'row':<7} {'reuse off/on':>14} {'TTFT mean off/on':>18} "
        f"{'p99 off/on':>16} {'ITL off/on':>12} {'e2e off/on':>16} {'busy imb. off/on':>17}"
    )
    for name in names:
        base, capacity = trace_of(name, args)
        for workers in map(int, args.workers.split(",")):
            for speed in map(float, args.speeds.split(",")):
                trace = sped_up(base, speed)
                found = {}
                for label, weight in (("off", 0.0), ("on", 1.0)):
                    config = ReplayConfig(
                        num_workers=workers,
                        capacity_blocks=capacity,
                        policy_config=PolicyConfig(pollution_weight=weight),
                    )
                    found[label] = row(replay(trace, "kvrouter", config))
                off, on = found["off"], found["on"]
                rows.append({"workload": name, "workers": workers, "speed": speed, **found})
                print(
                    f"{name:<16} {workers}w@{speed:g}x "
                    f"{off['reuse']:>6.1%}/{on['reuse']:<6.1%} "
                    f"{off['ttft_mean_ms']:>8.0f}/{on['ttft_mean_ms']:<8.0f} "
                    f"{off['ttft_p99_ms']:>7.0f}/{on['ttft_p99_ms']:<7.0f} "
                    f"{off['itl_mean_ms']:>5.1f}/{on['itl_mean_ms']:<5.1f} "
                    f"{off['e2e_mean_ms']:>7.0f}/{on['e2e_mean_ms']:<7.0f} "
                    f"{off['busy_imbalance']:>8.2f}/{on['busy_imbalance']:<.2f}",
                    flush=True,
                )
    args.output.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
