"""The OpenAI front door under aiperf: kv-aware routing against round robin
on the same multi-turn chat workload, as an outside load generator sees it.

Each policy gets a fresh deployment on 127.0.0.1 (a router with the front
door and 2 prefill + 2 decode CPU workers, a tiny random-weight Llama with
its own tokenizer). The bench writes one aiperf multi-turn dataset: chats
whose system prompts come from a small pool of long shared ones, each turn
sent with the conversation so far. aiperf (`pip install aiperf`; its CLI is
run as a subprocess, from its own venv if it does not fit this one) drives
`/v1/chat/completions` with streaming, and its own export gives TTFT, ITL,
request throughput and errors. The router's `kvrouter_overlap_ratio`
histogram (cached share of each prompt on the decode worker) gives the
prefix reuse per run, for the kv-aware policy only: under round robin the
router never looks prompts up in its index, so the histogram says nothing.

Prints one table and writes bench/results/front_door_aiperf.json.

    .venv/bin/python bench/front_door_aiperf.py [--aiperf ~/aiperf-venv/bin/aiperf]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import subprocess
import tempfile
import urllib.request
from pathlib import Path

from kvrouter.demo.cluster import LocalCluster, free_port
from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint

RESULTS = Path(__file__).resolve().parent / "results" / "front_door_aiperf.json"
ROLES = ["prefill", "prefill", "decode", "decode"]
POLICIES = {"kv": "kv-aware", "round_robin": "round robin"}
# Policies the router decides for without looking the prompt up in its index:
# their overlap histogram records 0 whatever the workers hold.
INDEX_BLIND = {"round_robin"}
MODEL_NAME = "tiny"
# aiperf's export names, and the statistics kept from each.
METRICS = {
    "time_to_first_token": ("avg", "p50", "p99"),
    "inter_token_latency": ("avg", "p50", "p99"),
    "request_latency": ("avg", "p50", "p99"),
    "request_throughput": ("avg",),
    "request_count": ("avg",),
    "output_sequence_length": ("avg",),
    "input_sequence_length": ("avg",),
}


def words(rng: random.Random, count: int) -> str:
    return " ".join(
        rng.choice(("alpha", "beta", "gamma", "delta", "omega")) + str(rng.randrange(100))
        for _ in range(count)
    )


def write_dataset(path: Path, args) -> int:
    """One multi-turn conversation a line; returns the number of turns."""
    rng = random.Random(args.seed)
    systems = [words(rng, args.system_words) for _ in range(args.system_prompts)]
    with path.open("w") as out:
        for chat in range(args.chats):
            turns = [{"role": "system", "text": systems[chat % len(systems)]}]
            turns += [{"text": words(rng, rng.randint(10, 25))} for _ in range(args.turns)]
            out.write(json.dumps({"session_id": f"chat-{chat}", "turns": turns}) + "\n")
    return args.chats * args.turns


def overlap_histogram(metrics_url: str) -> tuple[float, float]:
    """(sum, count) of kvrouter_overlap_ratio from the router's /metrics."""
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    total = {"sum": 0.0, "count": 0.0}
    for name, value in re.findall(
        r"^kvrouter_overlap_ratio_(sum|count)(?:\{[^}]*\})? (\S+)$", text, re.M
    ):
        total[name] += float(value)
    return total["sum"], total["count"]


def run_aiperf(
    aiperf: str, port: int, model: Path, dataset: Path, requests: int, out_dir: Path, args
) -> dict:
    command = [
        aiperf,
        "profile",
        "--model",
        MODEL_NAME,
        "--url",
        f"http://127.0.0.1:{port}",
        "--endpoint-type",
        "chat",
        "--streaming",
        # Token counts from the front door's usage chunk: re-tokenizing a
        # random model's text gives more tokens than were generated.
        "--use-server-token-count",
        "--tokenizer",
        str(model),
        "--input-file",
        str(dataset),
        "--custom-dataset-type",
        "multi_turn",
        "--concurrency",
        str(args.concurrency),
        "--request-count",
        str(requests),
        "--extra-inputs",
        f"max_tokens:{args.max_tokens}",
        "--extra-inputs",
        "ignore_eos:true",
        "--dataset-sampling-strategy",
        "sequential",
        "--random-seed",
        str(args.seed),
        "--output-artifact-dir",
        str(out_dir),
        "--ui",
        "none",
        "--no-server-metrics",
        "--no-gpu-telemetry",
        "--no-auto-plot",
    ]
    log = out_dir.parent / f"{out_dir.name}.aiperf.log"
    with log.open("w") as sink:
        subprocess.run(
            command, stdout=sink, stderr=subprocess.STDOUT, check=True, timeout=args.timeout_s
        )
    export = next(out_dir.rglob("profile_export_aiperf.json"))
    return json.loads(export.read_text())


def summarize(export: dict) -> dict:
    found = {"aiperf_version": export.get("aiperf_version")}
    for name, stats in METRICS.items():
        entry = export.get(name) or {}
        for stat in stats:
            if entry.get(stat) is not None:
                found[f"{name}_{stat}"] = entry[stat]
    errors = export.get("error_summary") or []
    found["errors"] = sum(e["count"] for e in errors)
    found["error_kinds"] = [e["error_details"] for e in errors]
    return found


def run_policy(
    aiperf: str, model: Path, policy: str, dataset: Path, requests: int, work: Path, args
) -> dict:
    http_port, metrics_port = free_port(), free_port()
    router_args = [
        "--http-listen",
        f"127.0.0.1:{http_port}",
        "--served-models",
        f"{MODEL_NAME}={model}",
    ]
    router_args += ["--metrics-listen", f"127.0.0.1:{metrics_port}"]
    env = {"KVROUTER_POLICY_LOCAL_PREFILL_MAX_TOKENS": str(args.local_prefill_max_tokens)}
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    log_dir = work / f"logs-{policy}"
    log_dir.mkdir()
    with LocalCluster(
        model,
        ROLES,
        policy=policy,
        router_env=env,
        router_args=router_args,
        worker_args=["--num-kv-blocks", str(args.kv_blocks)],
        served_models=[MODEL_NAME] * len(ROLES),
        log_dir=log_dir,
    ):
        before = overlap_histogram(metrics_url)
        export = run_aiperf(
            aiperf, http_port, model, dataset, requests, work / f"aiperf-{policy}", args
        )
        after = overlap_histogram(metrics_url)
    found = summarize(export)
    decisions = after[1] - before[1]
    found["routed_requests"] = decisions
    looked_up = decisions and policy not in INDEX_BLIND
    found["decode_overlap_mean"] = (after[0] - before[0]) / decisions if looked_up else None
    return found


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def print_table(results: dict[str, dict]) -> None:
    rows = [
        ("TTFT p50 ms", "time_to_first_token_p50"),
        ("TTFT p99 ms", "time_to_first_token_p99"),
        ("TTFT mean ms", "time_to_first_token_avg"),
        ("ITL p50 ms", "inter_token_latency_p50"),
        ("ITL p99 ms", "inter_token_latency_p99"),
        ("request latency p50 ms", "request_latency_p50"),
        ("throughput req/s", "request_throughput_avg"),
        ("requests", "request_count_avg"),
        ("prompt tokens, mean", "input_sequence_length_avg"),
        ("output tokens, mean", "output_sequence_length_avg"),
        ("errors", "errors"),
        ("decode-side overlap (router)", "decode_overlap_mean"),
    ]
    kv, rr = results["kv"], results["round_robin"]
    print(f"| metric | {POLICIES['kv']} | {POLICIES['round_robin']} | kv / rr |")
    print("|---|---:|---:|---:|")
    for label, key in rows:
        a, b = kv.get(key), rr.get(key)
        shown = [
            f"{v:.3g}" if isinstance(v, float) else "-" if v is None else str(v) for v in (a, b)
        ]
        print(f"| {label} | {shown[0]} | {shown[1]} | {ratio(a, b)} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--aiperf", default="aiperf", help="the aiperf CLI")
    parser.add_argument("--chats", type=int, default=24)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system-prompts", type=int, default=2)
    parser.add_argument("--system-words", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--local-prefill-max-tokens", type=int, default=128)
    parser.add_argument("--kv-blocks", type=int, default=512)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvrouter-aiperf-"))
    model = write_tiny_checkpoint(work / "model", "llama", seed=11)
    dataset = work / "chats.jsonl"
    requests = write_dataset(dataset, args)
    results = {}
    for policy in POLICIES:
        results[policy] = run_policy(args.aiperf, model, policy, dataset, requests, work, args)
    print_table(results)
    report = {
        "workload": {k: v for k, v in vars(args).items() if k not in ("aiperf", "out")},
        "roles": ROLES,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load": os.getloadavg(),
        },
        "results": results,
        "work_dir": str(work),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
