"""The trace bench's streams applied by kvrouter, by Dynamo's RadixTree, and by plain
hash maps doing only the map work an index of engine ids does
(`src_rust/benches/bare_maps.rs`).

The bare maps: a map from sequence hash to node and, with opaque engine ids, a second
from id to node (hashbrown, Fx hash, sized up front), with a 32-bit owner mask and
nothing else: no interned owner sets, tiers, shared names or prefetching. Beside the
budget that 5x Dynamo's apply rate leaves, they show what the unavoidable map work costs
done the plain way; kvrouter's own tables do it faster, so they are not a bound. CPU
nanoseconds a block over the whole stream, medians of the repeats; kvrouter's index is
sized for its workers' capacity as the service sizes it.

    PYTHONPATH=$PWD .venv/bin/python bench/index_bare_maps.py   # about 2.5 minutes
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import index_trace_bench as trace_bench
import numpy as np
import trace_workload

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "index_bare_maps.json"
SCALES = {scale.name: scale for scale in trace_bench.FULL_SCALES}


def write_stream(workload, chunks, path: Path) -> None:
    """Each event as the bare maps read it: worker, stored, count, then per block its
    sequence hash and opaque id (little-endian)."""
    with path.open("wb") as out:
        for chunk in chunks:
            for e in chunk:
                seq = trace_bench.seq_of(workload.blocks, e.blocks).astype("<u8")
                ids = workload.blocks.opaque(e.blocks.astype(np.uint64)).astype("<u8")
                out.write(struct.pack("<IBI", e.worker, int(e.stored), len(seq)))
                out.write(np.stack([seq, ids], axis=1).tobytes())


def kvrouter_ns(workload, chunks, mode: str, fleet_blocks: int, blocks: int) -> float:
    _, clocks, _ = trace_bench.run_kvrouter(
        trace_bench.kvrouter_chunks(workload.blocks, chunks, mode), reserve_blocks=fleet_blocks
    )
    return sum(clocks.cpu) / blocks * 1e9


def dynamo_ns(workload, chunks, blocks: int) -> float:
    tree, clocks = trace_bench.run_dynamo(
        workload.blocks, trace_bench.dynamo_chunks(workload.blocks, chunks), chunks
    )
    del tree
    return sum(clocks.cpu) / blocks * 1e9


def bare_maps_ns(stream: Path, capacity: int, repeats: int) -> dict[str, list[float]]:
    command = ["cargo", "run", "-q", "--release", "--example", "bare_maps", "--"]
    done = subprocess.run(
        [*command, str(stream), str(capacity), str(repeats)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"the bare maps (cargo run --example bare_maps) failed: {last}")
    return json.loads(done.stdout)


def bench_scale(rows, scale, repeats: int, seed: int) -> dict:
    workload = trace_workload.build(
        rows, workers=scale.workers, capacity=scale.capacity, tile=scale.tile, seed=seed
    )
    chunks = trace_bench.chunked(workload)
    blocks = sum(trace_bench.chunk_blocks(chunks))
    fleet = scale.workers * scale.capacity
    runs: dict[str, list[float]] = {"kvrouter/seq": [], "kvrouter/opaque": [], "dynamo": []}
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            runs["kvrouter/seq"].append(kvrouter_ns(workload, chunks, "seq", fleet, blocks))
            runs["kvrouter/opaque"].append(kvrouter_ns(workload, chunks, "opaque", fleet, blocks))
            runs["dynamo"].append(dynamo_ns(workload, chunks, blocks))
    finally:
        gc.enable()
    with tempfile.TemporaryDirectory() as tmp:
        stream = Path(tmp) / "stream.bin"
        write_stream(workload, chunks, stream)
        bare = bare_maps_ns(stream, fleet, repeats)
    runs["bare map"] = bare["one_map_ns"]
    runs["bare maps, two"] = bare["two_maps_ns"]
    return {
        "scale": scale.name,
        "blocks_applied": blocks,
        "ns_per_block": runs,
        "median_ns_per_block": {name: statistics.median(v) for name, v in runs.items()},
    }


def report(results: list[dict]) -> str:
    header = (
        f"{'scale':>5}  {'Dynamo':>7}  {'5x budget':>9}  {'ours, seq':>9}  "
        f"{'bare map':>8}  {'ours, opaque':>12}  {'bare maps, two':>14}"
    )
    lines = ["CPU ns a block, median of the repeats", header, "-" * len(header)]
    for r in results:
        m = r["median_ns_per_block"]
        lines.append(
            f"{r['scale']:>5}  {m['dynamo']:>7.1f}  {m['dynamo'] / 5:>9.1f}  "
            f"{m['kvrouter/seq']:>9.1f}  {m['bare map']:>8.1f}  "
            f"{m['kvrouter/opaque']:>12.1f}  {m['bare maps, two']:>14.1f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", default="100k,1M,10M", help="of " + ", ".join(SCALES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trace", type=Path, default=trace_bench.SHARED_TRACE)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    unknown = [name for name in args.scales.split(",") if name not in SCALES]
    if unknown:
        parser.error(f"unknown scale {unknown[0]!r}; choose from {', '.join(SCALES)}")
    started, load_at_start = time.time(), os.getloadavg()[0]
    rows = trace_workload.read_trace(args.trace)
    results = []
    for name in args.scales.split(","):
        print(f"{name}: applying", flush=True)
        results.append(bench_scale(rows, SCALES[name], args.repeats, args.seed))
    print(report(results))
    load = (round(load_at_start, 2), round(os.getloadavg()[0], 2))
    args.out.write_text(
        json.dumps({"trace": str(args.trace), "load_avg": load, "scales": results}, indent=1)
    )
    print(
        f"\n{time.time() - started:.0f} s, load {load[0]} at the start and {load[1]} at the "
        f"end; results in {args.out}"
    )


if __name__ == "__main__":
    main()
