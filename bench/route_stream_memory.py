"""What idle RouteStream calls cost the router, and whether cancelling them
gives it back: RSS of a real `kvrouter serve` with N idle streams open, then
after they are cancelled, over several rounds (a leak grows every round by
about what the streams held; allocator reuse does not).

    .venv/bin/python bench/route_stream_memory.py [--streams 1000] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path

import grpc

from kvrouter.demo.cluster import free_port

METHOD = "/kvrouter.v1.Router/RouteStream"
RESULTS = Path(__file__).parent / "results" / "route_stream_memory.json"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def measure(streams: int, rounds: int, settle_s: float) -> dict:
    port = free_port()
    router = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvrouter.cli",
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics-listen",
            "",
            "--log-decisions",
            "false",
            "--max-route-streams",
            str(streams),
        ],  # fmt: skip
        stderr=subprocess.DEVNULL,
    )
    rows = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await asyncio.wait_for(channel.channel_ready(), 30)
            await asyncio.sleep(settle_s)
            base = rss_mb(router.pid)
            for n in range(1, rounds + 1):
                calls = [channel.stream_stream(METHOD)() for _ in range(streams)]
                await asyncio.sleep(settle_s)
                opened = rss_mb(router.pid)
                for call in calls:
                    call.cancel()
                await asyncio.sleep(settle_s)
                rows.append({"round": n, "open_mb": opened, "after_cancel_mb": rss_mb(router.pid)})
    finally:
        router.terminate()
        router.wait(timeout=30)
    first = rows[0]
    return {
        "streams": streams,
        "base_mb": base,
        "kb_per_stream": (first["open_mb"] - base) * 1024 / streams,
        "rounds": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--settle-s", type=float, default=3.0)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    result = asyncio.run(measure(args.streams, args.rounds, args.settle_s))
    print(f"{result['streams']} idle RouteStreams: {result['kb_per_stream']:.1f} KB each; "
          f"router RSS {result['base_mb']:.1f} MB at start")  # fmt: skip
    print(f"{'round':>5} {'open MB':>8} {'after cancel MB':>16}")
    for row in result["rounds"]:
        print(f"{row['round']:>5} {row['open_mb']:>8.1f} {row['after_cancel_mb']:>16.1f}")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
