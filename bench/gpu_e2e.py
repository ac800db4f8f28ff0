"""End to end on CUDA: the same greedy requests through the router to
`kvrouter worker`s on the CPU and on CUDA must give identical tokens.

Each device gets a fresh deployment on 127.0.0.1: a router and one prefill
and one decode worker (one process each, so every split request hands its
KV off between them), serving a tiny random-weight Llama in fp32. The
requests share a few long prefixes, so prefix-cache hits and hand-offs both
occur. Where tokens differ, the first difference is reported with the
reference device's top-two logit margin at that step, which tells a near tie
from a defect. The deployments' logs stay in the temporary directory printed
as "logs".

    python bench/gpu_e2e.py [--requests 100] [--out bench/results/gpu_e2e.json]
        [--devices cpu,cuda]

Exits 1 unless every request matched.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from kvrouter.client.generate import GenerateClient
from kvrouter.demo.cluster import ClusterError, LocalCluster
from kvrouter.engine import EngineConfig, LLMEngine
from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint

ROLES = ["prefill", "decode"]
MAX_TOKENS = 16
VOCAB_SIZE = 256
CONCURRENCY = 16


def build_prompts(count: int, seed: int, vocab_size: int) -> list[list[int]]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(vocab_size) for _ in range(48)] for _ in range(8)]
    return [
        rng.choice(prefixes) + [rng.randrange(vocab_size) for _ in range(rng.randint(4, 40))]
        for _ in range(count)
    ]


async def serve_all(target: str, prompts: list[list[int]]) -> list[dict]:
    limit = asyncio.Semaphore(CONCURRENCY)
    async with GenerateClient(target, timeout=120.0) as client:

        async def one(prompt: list[int]) -> dict:
            async with limit:
                generation = await client.generate(prompt, max_tokens=MAX_TOKENS, ignore_eos=True)
            return {
                "tokens": generation.token_ids,
                "split": generation.prefill_worker not in (None, generation.decode_worker),
            }

        return await asyncio.gather(*(one(prompt) for prompt in prompts))


def run_on(device: str, model: Path, prompts: list[list[int]], log_dir: Path) -> dict:
    started = time.monotonic()
    worker_args = ["--device", device, "--num-kv-blocks", "512"]
    # Every request is split, however short: the hand-off is part of the check.
    env = {"KVROUTER_POLICY_LOCAL_PREFILL_MAX_TOKENS": "0"}
    cluster = LocalCluster(model, ROLES, router_env=env, worker_args=worker_args, log_dir=log_dir)
    with cluster:
        ready_s = time.monotonic() - started
        served = time.monotonic()
        results = asyncio.run(serve_all(cluster.target, prompts))
        serve_s = time.monotonic() - served
    return {"device": device, "ready_s": ready_s, "serve_s": serve_s, "results": results}


def first_difference(expected: list[int], actual: list[int]) -> int:
    """The first step where the two differ (the shorter's length if one is
    the other's prefix)."""
    steps = zip(expected, actual, strict=False)
    return next((i for i, (a, b) in enumerate(steps) if a != b), min(len(expected), len(actual)))


def top_two_margin(engine: LLMEngine, tokens: list[int]) -> float:
    logits = engine.prompt_logits(tokens)[-1]
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--out", default="bench/results/gpu_e2e.json")
    parser.add_argument(
        "--devices", default="cpu,cuda", help="the reference's device, then the one checked"
    )
    args = parser.parse_args()
    devices = args.devices.split(",")
    if len(devices) != 2:
        parser.error(
            f"--devices takes two devices, the reference's and the checked one's: {args.devices!r}"
        )
    reference_device, checked_device = devices
    if "cuda" in args.devices and not torch.cuda.is_available():
        print("gpu_e2e needs a CUDA device", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="kvrouter-gpu-e2e-"))
    model = write_tiny_checkpoint(work / "model", "llama", vocab_size=VOCAB_SIZE, seed=args.seed)
    prompts = build_prompts(args.requests, args.seed, VOCAB_SIZE)
    runs = []
    for device in (reference_device, checked_device):
        log_dir = work / f"{len(runs)}-{device}"
        log_dir.mkdir()
        try:
            runs.append(run_on(device, model, prompts, log_dir))
        except ClusterError:
            for log in sorted(log_dir.glob("*.log")):
                print(f"--- {log.name}", *log.read_text().splitlines()[-20:], sep="\n")
            raise

    reference = LLMEngine(EngineConfig(model=model, num_kv_blocks=64, device=reference_device))
    differences = []
    for index, (prompt, expected, actual) in enumerate(
        zip(prompts, runs[0]["results"], runs[1]["results"], strict=True)
    ):
        if expected["tokens"] != actual["tokens"]:
            step = first_difference(expected["tokens"], actual["tokens"])
            margin = top_two_margin(reference, prompt + expected["tokens"][:step])
            differences.append({"request": index, "step": step, "reference_top2_margin": margin})
    matched = args.requests - len(differences)
    summary = {
        "requests": args.requests,
        "identical": matched,
        "differences": differences,
        "devices": [reference_device, checked_device],
        "split_requests": [sum(r["split"] for r in run["results"]) for run in runs],
        "serve_s": [run["serve_s"] for run in runs],
        "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "logs": str(work),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({**summary, "runs": runs}, indent=2))
    print(json.dumps(summary, indent=2))
    devices = f"{reference_device} and {checked_device}"
    print(f"{matched} of {args.requests} requests identical on {devices}")
    return 0 if matched == args.requests else 1


if __name__ == "__main__":
    sys.exit(main())
