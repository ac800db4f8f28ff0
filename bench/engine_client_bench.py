"""The router's engine client against aiohttp, in one process: CPU time a
request, for the front door's call shape (a 4,096-id prompt POSTed as JSON,
16 tokens streamed back) against bench/openai_stub_backend.py, which costs
nothing. Rounds alternate which client goes first.

Prints one table and writes bench/results/engine_client.json.

    PYTHONPATH=$PWD .venv/bin/python bench/engine_client_bench.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import msgspec
import uvloop

from kvrouter.demo.cluster import free_port
from kvrouter.net.http_client import HttpClient

HERE = Path(__file__).resolve().parent
HEADERS = {"Content-Type": "application/json"}


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def drive(one, requests: int, concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def guarded():
        async with gate:
            await one()

    await asyncio.gather(*(guarded() for _ in range(requests)))


async def with_aiohttp(url: str, body: bytes, requests: int, concurrency: int) -> None:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one():
            async with session.post(url, data=body, headers=HEADERS) as response:
                while await response.content.readany():
                    pass

        await drive(one, requests, concurrency)


async def with_ours(url: str, body: bytes, requests: int, concurrency: int) -> None:
    client = HttpClient()

    async def one():
        response = await client.post(url, body, HEADERS)
        while await response.read_some():
            pass
        response.release()

    try:
        await drive(one, requests, concurrency)
    finally:
        await client.close()


CLIENTS = {"aiohttp": with_aiohttp, "kvrouter HttpClient": with_ours}


async def measure(args, url: str) -> dict:
    body = msgspec.json.encode(
        {
            "prompt": list(range(args.prompt_tokens)),
            "max_tokens": args.output_tokens,
            "stream": True,
            "return_token_ids": True,
        }
    )
    runs = {name: [] for name in CLIENTS}
    for round_ in range(args.rounds):
        order = list(CLIENTS) if round_ % 2 == 0 else list(reversed(CLIENTS))
        for name in order:
            await CLIENTS[name](url, body, args.requests // 10, args.concurrency)  # warm
            cpu, wall = cpu_s(), time.perf_counter()
            await CLIENTS[name](url, body, args.requests, args.concurrency)
            runs[name].append(
                {
                    "cpu_us_per_request": 1e6 * (cpu_s() - cpu) / args.requests,
                    "requests_per_s": args.requests / (time.perf_counter() - wall),
                }
            )
    return runs


async def wait_ready(url: str) -> None:
    client = HttpClient()
    try:
        for _ in range(100):
            try:
                response = await client.post(url, b"{}", HEADERS)
                await response.read()
                response.release()
                return
            except OSError:
                await asyncio.sleep(0.1)
        raise SystemExit("the stub backend did not start")
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--output", type=Path, default=HERE / "results" / "engine_client.json")
    args = parser.parse_args()
    port = free_port()
    backend = subprocess.Popen(
        [sys.executable, str(HERE / "openai_stub_backend.py"), "--port", str(port)]
    )
    url = f"http://127.0.0.1:{port}/v1/completions"
    load_before = os.getloadavg()
    try:
        uvloop.run(wait_ready(url))
        runs = uvloop.run(measure(args, url))
    finally:
        backend.terminate()
        backend.wait()
    print(f"{'client':<20} {'CPU µs / request (median, range)':>34} {'requests/s (median)':>20}")
    for name, results in runs.items():
        cpu = [r["cpu_us_per_request"] for r in results]
        rate = statistics.median(r["requests_per_s"] for r in results)
        cell = f"{statistics.median(cpu):.0f} ({min(cpu):.0f}-{max(cpu):.0f})"
        print(f"{name:<20} {cell:>34} {rate:>20.0f}")
    report = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "runs": runs,
    }
    args.output.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
