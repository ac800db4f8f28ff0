"""End to end on CPU: kv-aware routing against round robin through the
router's proxied Generate, on the same multi-turn chat and agent workload.

Each policy gets a fresh deployment on 127.0.0.1 (a router and 2 prefill +
2 decode workers, one process each, a tiny random-weight Llama); every
session runs concurrently, its turns in order. Reported per policy:

- TTFT p50 / p99 as the client sees it;
- prefix reuse: prompt tokens served from the prefilling worker's cache;
- hand-offs: split requests, blocks reused on the decode worker, blocks and
  bytes transferred;
- the hand-off's share of TTFT: transfer time over TTFT, for split requests.
  The first token comes from the prefill worker, so the transfer delays the
  second token, not the first; the time to the second token is reported too.

Prints one table and writes bench/results/e2e_bench.json.

    .venv/bin/python bench/e2e_bench.py [--chats 8] [--agents 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path

from kvrouter.demo.cluster import LocalCluster
from kvrouter.demo.runner import WorkloadRun, run_workload
from kvrouter.demo.workload import build_workload
from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint

RESULTS = Path(__file__).resolve().parent / "results" / "e2e_bench.json"
ROLES = ["prefill", "prefill", "decode", "decode"]
POLICIES = {"kv": "kv-aware", "round_robin": "round robin"}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def run_policy(model: Path, policy: str, args, seed: int, log_dir: Path) -> WorkloadRun:
    sessions = build_workload(
        chats=args.chats,
        agents=args.agents,
        chat_turns=args.chat_turns,
        agent_steps=args.agent_steps,
        seed=seed,
    )
    env = {"KVROUTER_POLICY_LOCAL_PREFILL_MAX_TOKENS": str(args.local_prefill_max_tokens)}
    with LocalCluster(
        model,
        ROLES,
        policy=policy,
        router_env=env,
        worker_args=["--num-kv-blocks", str(args.kv_blocks)],
        log_dir=log_dir,
    ) as cluster:
        return asyncio.run(
            run_workload(cluster.target, sessions, policy, max_tokens=args.max_tokens)
        )


def summarize(runs: list[WorkloadRun]) -> dict:
    turns = [t for run in runs for t in run.turns]
    stats = [t.result.stats for t in turns]
    split = [(t, t.result.stats) for t in turns if t.result.stats.disaggregated]
    prompt = sum(s.prompt_tokens for s in stats)
    ttft = [t.client_ttft_ms for t in turns]
    reused = sum(s.blocks_reused for _, s in split)
    moved = sum(s.blocks_transferred for _, s in split)
    return {
        "requests": len(turns),
        "ttft_p50_ms": percentile(ttft, 0.5),
        "ttft_p99_ms": percentile(ttft, 0.99),
        "ttft_mean_ms": statistics.fmean(ttft),
        "second_token_p50_ms": percentile([t.client_second_token_ms for t in turns], 0.5),
        "prefix_reuse": sum(s.cached_tokens for s in stats) / max(prompt, 1),
        "split_requests": len(split),
        "decode_side_reuse": reused / max(reused + moved, 1),
        "blocks_transferred": moved,
        "bytes_transferred": sum(s.bytes_transferred for _, s in split),
        "handoff_ms_mean": statistics.fmean([s.transfer_ms for _, s in split]) if split else 0.0,
        "handoff_share_of_ttft": statistics.fmean(
            [s.transfer_ms / t.client_ttft_ms for t, s in split]
        )
        if split
        else 0.0,
        "retries": sum(s.retries for s in stats),
        "wall_s": sum(run.wall_s for run in runs),
    }


def table(results: dict[str, dict]) -> str:
    columns = [
        ("TTFT p50", "ttft_p50_ms", "{:.1f}"),
        ("p99", "ttft_p99_ms", "{:.1f}"),
        ("2nd tok p50", "second_token_p50_ms", "{:.1f}"),
        ("reuse", "prefix_reuse", "{:.0%}"),
        ("split", "split_requests", "{}"),
        ("D reuse", "decode_side_reuse", "{:.0%}"),
        ("moved MiB", "bytes_transferred", "{:.2f}"),
        ("hand-off ms", "handoff_ms_mean", "{:.1f}"),
        ("/TTFT", "handoff_share_of_ttft", "{:.0%}"),
        ("wall s", "wall_s", "{:.1f}"),
    ]
    header = ["policy"] + [c[0] for c in columns]
    rows = []
    for policy, r in results.items():
        cells = [POLICIES[policy]]
        for _, key, fmt in columns:
            value = r[key] / (1 << 20) if key == "bytes_transferred" else r[key]
            cells.append(fmt.format(value))
        rows.append(cells)
    widths = [max(len(x), *(len(row[i]) for row in rows)) for i, x in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=8)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--chat-turns", type=int, default=4)
    parser.add_argument("--agent-steps", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--local-prefill-max-tokens", type=int, default=128)
    parser.add_argument("--kv-blocks", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=2, help="workloads (seeds) per policy")
    args = parser.parse_args()

    runs: dict[str, list[WorkloadRun]] = {policy: [] for policy in POLICIES}
    with tempfile.TemporaryDirectory(prefix="kvrouter-e2e-") as tmp:
        model = write_tiny_checkpoint(Path(tmp) / "tiny-llama", "llama", seed=0)
        for seed in range(args.rounds):
            # Alternate the order so neither policy always runs on a warmer machine.
            order = list(POLICIES) if seed % 2 == 0 else list(POLICIES)[::-1]
            for policy in order:
                log_dir = Path(tmp) / f"{policy}-{seed}"
                log_dir.mkdir()
                runs[policy].append(run_policy(model, policy, args, seed, log_dir))
    results = {policy: summarize(policy_runs) for policy, policy_runs in runs.items()}
    print(table(results))
    kv, rr = results["kv"], results["round_robin"]
    print(
        f"\nkv-aware vs round robin: TTFT p50 x{rr['ttft_p50_ms'] / kv['ttft_p50_ms']:.2f} "
        f"faster, p99 x{rr['ttft_p99_ms'] / kv['ttft_p99_ms']:.2f}; "
        f"{kv['bytes_transferred'] / max(rr['bytes_transferred'], 1):.0%} of the bytes moved"
    )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "config": vars(args),
                "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                "results": results,
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
