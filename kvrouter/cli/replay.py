"""`kvrouter replay`: replay a trace against simulated workers under several
routing policies and compare them."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "replay a Mooncake trace (or a synthetic workload) on simulated workers and compare policies"
EXTRA = "replay"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvrouter.policy import POLICIES

    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="Mooncake-format JSONL trace")
    src.add_argument("--synthetic", type=int, metavar="N",
                     help="generate N requests of multi-turn chat and agent traffic")  # fmt: skip
    parser.add_argument("--trace-block-size", type=int, default=512,
                        help="tokens per hash id in the trace (Mooncake: 512)")  # fmt: skip
    parser.add_argument("--speedup", type=float, default=1.0, help="arrival speed multiplier")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help=f"comma-separated, from: {', '.join(POLICIES)}")  # fmt: skip
    parser.add_argument("--workers", type=int, default=8, help="aggregated (or decode) workers")
    parser.add_argument("--prefill-workers", type=int, default=0, help="> 0 for P/D mode")
    parser.add_argument("--capacity-blocks", type=int, default=16_384)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--event-lag-ms", type=float, default=0.0,
                        help="delay of KV events on their way to the router")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument(
        "--plot", metavar="PNG", help="write TTFT CDFs per policy (needs matplotlib)"
    )
    parser.add_argument("--no-progress", action="store_true")


def format_table(results: list[dict]) -> str:
    head = (f"{'policy':<13} {'reuse':>6} {'TTFT mean':>9} {'p50':>7} {'p99':>7} {'ITL mean':>8} "
            f"{'E2E mean':>8} {'req/s':>6} {'imbal':>6} {'wall s':>6}")  # fmt: skip
    rows = [head, "-" * len(head)]
    for r in results:
        t = r["ttft_ms"]
        rows.append(
            f"{r['policy']:<13} {r['prefix_reuse_ratio']:>6.1%} {t['mean']:>9.1f} {t['p50']:>7.1f} "
            f"{t['p99']:>7.1f} {r['itl_ms']['mean']:>8.2f} {r['e2e_ms']['mean']:>8.1f} "
            f"{r['throughput']['requests_per_s']:>6.2f} {r['imbalance']['busy_time']:>6.2f} "
            f"{r['wall_s']:>6.2f}"
        )
    return "\n".join(rows)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from kvrouter.replay import ReplayConfig, load_mooncake, replay
    from kvrouter.replay.report import plot_ttft_cdf
    from kvrouter.replay.synthetic import WorkloadShape, generate

    try:
        if args.trace:
            trace = load_mooncake(args.trace, args.speedup)
        else:
            shape = WorkloadShape(num_requests=args.synthetic)
            shape.sessions_per_s *= args.speedup
            trace = generate(shape, args.trace_block_size, args.seed)
        cfg = ReplayConfig(
            num_workers=args.workers,
            num_prefill_workers=args.prefill_workers,
            capacity_blocks=args.capacity_blocks,
            block_size=args.block_size,
            trace_block_size=args.trace_block_size,
            event_lag_ms=args.event_lag_ms,
            seed=args.seed,
        )
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        results = []
        for policy in policies:
            with tqdm(total=len(trace), desc=policy, disable=args.no_progress, leave=False) as bar:
                results.append(replay(trace, policy, cfg, progress=bar.update))
    except (OSError, ValueError) as e:
        print(f"kvrouter replay: {e}", file=sys.stderr)
        return 2
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{k: v for k, v in r.items() if k != "ttft_samples_ms"} for r in results],
                      f, indent=2)  # fmt: skip
    if args.plot:
        plot_ttft_cdf(results, args.plot)
    return 0
