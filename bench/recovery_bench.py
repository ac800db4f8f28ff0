"""Router recovery time with a large index: 1M blocks over 32 workers are
snapshotted, then a router starts from the snapshot. Prints a table and
writes bench/results/recovery_bench.json.

Timed: writing the snapshot, a router start from it (restore plus gRPC
start, until it serves), and the first routing decision after it.

    .venv/bin/python bench/recovery_bench.py [--blocks 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import tempfile
import time
from pathlib import Path

from kvrouter._core import PrefixIndex, Stored
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.service import RouterServer, ServiceConfig
from kvrouter.service.workers import WorkerRecord

RESULTS = Path(__file__).resolve().parent / "results" / "recovery_bench.json"
CHAIN = 1024


def filled_index(blocks: int, workers: int) -> PrefixIndex:
    index = PrefixIndex(16)
    rng = random.Random(0)
    per_worker = blocks // workers
    for worker in range(workers):
        events = []
        for start in range(0, per_worker, CHAIN):
            n = min(CHAIN, per_worker - start)
            ids = list(range(start + 1, start + n + 1))
            events.append(Stored(ids, local_hashes=[rng.getrandbits(64) for _ in ids]))
        index.apply(worker, 0, events)
    return index


async def start_from(path: Path) -> tuple[float, float, dict]:
    config = dataclasses.replace(
        ServiceConfig(),
        listen="127.0.0.1:0",
        metrics_listen="",
        log_decisions=False,
        snapshot_path=str(path),
    )
    started = time.perf_counter()
    server = RouterServer(config)
    await server.start()
    serving = time.perf_counter() - started
    server.workers.register(WorkerRecord(0, "both", "w0:1", 16, 1 << 20))
    started = time.perf_counter()
    server.routing.decide(pb.RouteRequest(tokens=list(range(4096))).SerializeToString())
    first = time.perf_counter() - started
    stats = server.index.stats()
    await server.stop(grace=0)
    return serving, first, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    index = filled_index(args.blocks, args.workers)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "index.snap"
        started = time.perf_counter()
        data = index.snapshot()
        path.write_bytes(data)
        write_s = time.perf_counter() - started
        serving_s, first_route_s, stats = asyncio.run(start_from(path))
    result = {
        "blocks": stats["blocks"],
        "workers": args.workers,
        "snapshot_mb": len(data) / 1e6,
        "snapshot_write_s": write_s,
        "start_to_serving_s": serving_s,
        "first_route_ms": first_route_s * 1e3,
    }
    for key, value in result.items():
        print(
            f"{key:<22} {value:>12,.3f}" if isinstance(value, float) else f"{key:<22} {value:>12,}"
        )
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
