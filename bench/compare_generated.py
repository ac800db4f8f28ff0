"""kvrouter against Dynamo's KV router on generated workloads the policy was
not developed on.

Writes five workloads from kvrouter's synthetic generator (multi-turn chat
and agents, see kvrouter/replay/synthetic.py) as Mooncake traces and runs
bench/compare_dynamo.py on each: Dynamo's mocker in round_robin and
kv_router modes beside our replay, at 4, 8 and 16 workers and 1x and 2x
arrival speed (by default). Prints one summary table and the verdict table
(compare_dynamo.py); each workload's full results go to
bench/results/compare_generated_<name>.json, or with `--seed N` other
than 1 to compare_generated_seedN_<name>.json.

    .venv/bin/python bench/compare_generated.py [--workloads mix,tenants]
        [--workers 4,8,16] [--speeds 1,2,3]          # about 10 minutes at 1,2
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_dynamo  # noqa: E402

from kvrouter.replay.synthetic import WorkloadShape, generate  # noqa: E402
from kvrouter.replay.trace import write_mooncake  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

WORKLOADS = {
    # The generator's default mix of chat sessions and agents.
    "mix": WorkloadShape(num_requests=4000, sessions_per_s=1.0),
    # The same mix arriving three times as fast.
    "busy": WorkloadShape(num_requests=4000, sessions_per_s=3.0),
    # Mostly agents with long private prefixes and bursts of calls.
    "agents": WorkloadShape(
        num_requests=4000, sessions_per_s=1.0, agent_fraction=0.8, agent_prefix_blocks=(32, 96)
    ),
    # Chat only, on three long shared documents: hot prefixes.
    "longdocs": WorkloadShape(
        num_requests=4000,
        sessions_per_s=1.5,
        agent_fraction=0.0,
        system_prompts=3,
        system_prompt_blocks=(48, 48),
    ),
    # Many tenants on a few long system prompts (6-16k tokens), arriving in
    # bursts: 20 s on, 40 s off. Load piles onto the workers that hold the
    # hot prompts unless the policy prices what it does to their decodes.
    "tenants": WorkloadShape(
        num_requests=4000,
        sessions_per_s=1.5,
        agent_fraction=0.0,
        system_prompts=4,
        system_prompt_blocks=(12, 32),
        turns=(1, 4),
        user_blocks=(1, 2),
        bursts=(20.0, 40.0),
    ),
}


def workload_trace(name: str, seed: int, directory: Path) -> Path:
    """The Mooncake-format trace of workload `name`: the shared Mooncake
    trace for "mooncake", else the generated workload written into
    `directory`."""
    if name == "mooncake":
        return compare_dynamo.TRACE
    trace = directory / f"{name}.jsonl"
    write_mooncake(trace, generate(WORKLOADS[name], seed=seed))
    return trace


def results_name(workload: str, seed: int) -> str:
    """The results file of `workload` generated with `seed`: seed 1's files
    carry no seed, so that another seed's run does not overwrite them."""
    return f"compare_generated_{'' if seed == 1 else f'seed{seed}_'}{workload}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", default="4,8,16")
    parser.add_argument("--speeds", default="1,2")
    args = parser.parse_args(argv)
    summary = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.workloads.split(","):
            trace = workload_trace(name, args.seed, Path(tmp))
            out = RESULTS / results_name(name, args.seed)
            print(f"{name}: replaying ...", flush=True)
            with contextlib.redirect_stdout(io.StringIO()):
                compare_dynamo.main(
                    ["--trace", str(trace), "--output", str(out), "--no-wall",
                     "--workers", args.workers, "--speeds", args.speeds]
                )  # fmt: skip
            summary.append((name, out))
    print_table(summary)
    return 0


def print_table(summary: list[tuple[str, Path]]) -> None:
    print(
        f"\n{'workload':<10} {'config':<8} {'reuse: Dynamo KV / kvrouter':>28} "
        f"{'mean x':>7} {'p99 x':>6} {'floor mean x':>13} {'floor p99 x':>12} {'calibrated':>11}"
    )
    for name, path in summary:
        report = json.loads(path.read_text())
        for row in report["rows"]:
            key = f"{row['workers']}w@{row['speed']:g}x"
            t = report["targets"][key]
            kv, mine = row["dynamo_kv_router"], row["ours_kvrouter"]
            print(
                f"{name:<10} {key:<8} {kv['reuse']:>19.1%} / {mine['reuse']:.1%} "
                f"{t['ttft_mean_ratio']:>7.2f} {t['ttft_p99_ratio']:>6.2f} "
                f"{t['floor_ttft_mean_ratio']:>13.2f} {t['floor_ttft_p99_ratio']:>12.2f} "
                f"{calibrated(t):>11}"
            )
    print(f"\nverdict against Dynamo's KV router\n{'workload':<10} {'row':<9} "
          f"{compare_dynamo.VERDICT_HEADER}")  # fmt: skip
    for name, path in summary:
        compare_dynamo.print_verdicts(json.loads(path.read_text()), f"{name:<10} ")


def calibrated(t: dict) -> str:
    return "yes" if t["calibrated"] else "NO"


if __name__ == "__main__":
    sys.exit(main())
