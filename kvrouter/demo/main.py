"""The demo: the same workload against two fresh deployments on 127.0.0.1
(2 prefill + 2 decode CPU workers, a tiny random-weight model), first with
kv-aware routing, then with round robin; tables of both."""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kvrouter.demo.cluster import ClusterError, LocalCluster
from kvrouter.demo.report import summary, turn_tables
from kvrouter.demo.runner import WorkloadRun, run_workload
from kvrouter.demo.workload import build_workload

ROLES = ["prefill", "prefill", "decode", "decode"]
BLOCK_SIZE = 16


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
    seed: int = 0
    log_dir: str = ""


def _run(model: Path, policy: str, options: DemoOptions, log_dir: Path) -> WorkloadRun:
    sessions = build_workload(
        chats=options.chats,
        agents=options.agents,
        chat_turns=options.chat_turns,
        agent_steps=options.agent_steps,
        seed=options.seed,
    )
    env = {"KVROUTER_POLICY_LOCAL_PREFILL_MAX_TOKENS": str(options.local_prefill_max_tokens)}
    cluster = LocalCluster(
        model,
        ROLES,
        policy=policy,
        router_env=env,
        worker_args=["--num-kv-blocks", "512"],
        log_dir=log_dir,
    )
    started = time.perf_counter()
    with cluster:
        print(
            f"  {policy}: router {cluster.target}, workers ready in "
            f"{time.perf_counter() - started:.1f}s (P: 1, 2; D: 3, 4)",
            file=sys.stderr,
        )
        return asyncio.run(
            run_workload(cluster.target, sessions, policy, max_tokens=options.max_tokens)
        )


def run_demo(options: DemoOptions) -> int:
    from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint

    with tempfile.TemporaryDirectory(prefix="kvrouter-demo-") as tmp:
        model = write_tiny_checkpoint(Path(tmp) / "tiny-llama", "llama", seed=options.seed)
        runs = {}
        for policy in ("kv", "round_robin"):
            log_dir = Path(options.log_dir or tmp) / policy
            log_dir.mkdir(parents=True, exist_ok=True)
            try:
                runs[policy] = _run(model, policy, options, log_dir)
            except (ClusterError, Exception) as e:
                print(f"kvrouter demo: {policy} run failed: {e}", file=sys.stderr)
                for log in sorted(log_dir.glob("*.log")):
                    tail = log.read_text(errors="replace").splitlines()[-15:]
                    print(f"--- {log.name}\n" + "\n".join(tail), file=sys.stderr)
                return 1
    print("\nkv-aware routing, per turn (P and D are worker ids; 1-2 prefill, 3-4 decode)\n")
    print(turn_tables(runs["kv"], BLOCK_SIZE))
    print("\nsummary (same workload, fresh workers for each policy)\n")
    print(summary(runs["kv"], runs["round_robin"]))
    return 0
