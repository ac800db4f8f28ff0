"""The demo: the same workload against two deployments on 127.0.0.1 (2
prefill + 2 decode CPU workers each, a tiny random-weight model), one
routing kv-aware and one round robin, for several rounds; then a burst of
long prompts under running streams, with disaggregation and on workers
that do both. Tables of all of it; `--json` keeps the numbers.

Rounds alternate which policy goes first, and each round's workload is new
(another seed), so that a busy stretch of a shared machine does not land on
one policy: the summary gives each policy's median over the rounds and
their spread."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from kvrouter.demo.burst import BurstRun, run_burst
from kvrouter.demo.cluster import ClusterError, LocalCluster
from kvrouter.demo.report import burst_table, round_stats, summary, turn_tables
from kvrouter.demo.runner import WorkloadRun, run_workload
from kvrouter.demo.workload import build_workload

DISAGGREGATED = ["prefill", "prefill", "decode", "decode"]
AGGREGATED = ["both"] * 4
POLICIES = ("kv", "round_robin")
BLOCK_SIZE = 16
# The aggregated deployment never splits a request.
NEVER_SPLIT = str(1 << 30)


@dataclass
class DemoOptions:
    chats: int = 6
    agents: int = 3
    chat_turns: int = 4
    agent_steps: int = 5
    max_tokens: int = 24
    # Prefill on the decode worker when at most this many prompt tokens are
    # uncached there (the policy's conditional disaggregation threshold).
    local_prefill_max_tokens: int = 128
    rounds: int = 5
    burst: bool = True
    seed: int = 0
    log_dir: str = ""
    json_path: str = ""


def _clusters(model: Path, options: DemoOptions, log_root: Path) -> dict[str, LocalCluster]:
    split = {"KVROUTER_POLICY_LOCAL_PREFILL_MAX_TOKENS": str(options.local_prefill_max_tokens)}
    specs = {policy: (DISAGGREGATED, policy, split) for policy in POLICIES}
    if options.burst:
        specs["aggregated"] = (
            AGGREGATED,
            "kv",
            {"KVROUTER_POLICY_LOCAL_PREFILL_MAX_TOKENS": NEVER_SPLIT},
        )
    clusters = {}
    for name, (roles, policy, env) in specs.items():
        log_dir = log_root / name
        log_dir.mkdir(parents=True, exist_ok=True)
        clusters[name] = LocalCluster(
            model,
            roles,
            policy=policy,
            router_env=env,
            worker_args=["--num-kv-blocks", "512"],
            log_dir=log_dir,
        )
    return clusters


def _start_all(clusters: dict[str, LocalCluster], stack: ExitStack) -> None:
    """Starts every deployment's processes before waiting for any, so that
    they load their models side by side."""
    started = time.perf_counter()
    deadlines = []
    for cluster in clusters.values():
        stack.callback(cluster.stop)
        deadlines.append(cluster.launch())
    for cluster, deadline in zip(clusters.values(), deadlines, strict=True):
        cluster.wait_for_workers(deadline)
    roles = ", ".join(f"{name} {cluster.target}" for name, cluster in clusters.items())
    print(f"  routers: {roles}; ready in {time.perf_counter() - started:.1f}s", file=sys.stderr)


def _round(
    clusters: dict[str, LocalCluster], options: DemoOptions, index: int
) -> dict[str, WorkloadRun]:
    sessions = build_workload(
        chats=options.chats,
        agents=options.agents,
        chat_turns=options.chat_turns,
        agent_steps=options.agent_steps,
        seed=options.seed + index,
    )
    order = POLICIES if index % 2 == 0 else POLICIES[::-1]
    runs = {}
    for policy in order:
        runs[policy] = asyncio.run(
            run_workload(
                clusters[policy].target,
                sessions,
                f"round {index + 1} {policy}",
                max_tokens=options.max_tokens,
            )
        )
    return runs


def run_demo(options: DemoOptions) -> int:
    from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint

    with tempfile.TemporaryDirectory(prefix="kvrouter-demo-") as tmp:
        model = write_tiny_checkpoint(Path(tmp) / "tiny-llama", "llama", seed=options.seed)
        clusters = _clusters(model, options, Path(options.log_dir or tmp))
        try:
            with ExitStack() as stack:
                _start_all(clusters, stack)
                rounds = [_round(clusters, options, i) for i in range(options.rounds)]
                bursts: dict[str, BurstRun] = {}
                if options.burst:
                    for name in ("kv", "aggregated"):
                        bursts[name] = asyncio.run(
                            run_burst(clusters[name].target, seed=options.seed)
                        )
        except (ClusterError, Exception) as e:
            print(f"kvrouter demo failed: {e}", file=sys.stderr)
            for log in sorted(Path(options.log_dir or tmp).glob("*/*.log")):
                tail = log.read_text(errors="replace").splitlines()[-15:]
                print(f"--- {log.parent.name}/{log.name}\n" + "\n".join(tail), file=sys.stderr)
            return 1
    print("\nkv-aware routing, round 1, per turn (P and D: worker ids; 1-2 prefill, 3-4 decode)\n")
    print(turn_tables(rounds[0]["kv"], BLOCK_SIZE))
    print(f"\nsummary: {options.rounds} rounds, each a new workload, both policies on it\n")
    print(summary(rounds))
    if bursts:
        print("\nrunning streams under a burst of long prompts\n")
        print(burst_table(bursts["kv"], bursts["aggregated"]))
    if options.json_path:
        Path(options.json_path).write_text(
            json.dumps(
                {
                    "rounds": [
                        {policy: round_stats(run) for policy, run in runs.items()}
                        for runs in rounds
                    ],
                    "burst": {name: asdict(run) for name, run in bursts.items()},
                },
                indent=1,
            )
        )
    return 0
