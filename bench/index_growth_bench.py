"""The trace bench's stream (10M blocks, or `--scale`) applied by several index builds in turn.

Each `--core NAME=PATH` is a built extension (`_core.abi3.so`) loaded as a module of its
own, so that two builds run in one process on the same events, chunk by chunk in turn:
the per-chunk tail (slowest chunk over the median, CPU time), the apply rate and find
latency are compared within a second of each other on a shared machine. Kvrouter only,
both engine-id modes; the workload and timing are `index_trace_bench`'s.

    .venv/bin/python bench/index_growth_bench.py --core main=../main/kvrouter/_core.abi3.so \\
        --core new=kvrouter/_core.abi3.so
"""

from __future__ import annotations

import argparse
import array
import importlib.machinery
import importlib.util
import json
import os
import statistics
import time
from pathlib import Path

import index_trace_bench as trace_bench
import numpy as np
import trace_workload

RESULTS = Path(__file__).resolve().parent / "results" / "index_growth.json"
SCALES = {scale.name: scale for scale in trace_bench.FULL_SCALES}
FIND_SECONDS = 0.05
FIND_ROUNDS = 10


def load_core(name: str, path: Path):
    """The extension at `path` as a module named `<name>._core`: its init symbol is
    `PyInit__core` whatever package holds it."""
    loader = importlib.machinery.ExtensionFileLoader(f"{name}._core", str(path))
    spec = importlib.util.spec_from_file_location(f"{name}._core", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def find_queries(workload, seed: int) -> dict[str, list[array.array]]:
    """Up to 100 of the trace's prompts per length class, as `array('Q')`."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, low, high in trace_bench.PROMPT_CLASSES:
        picks = [r for r in workload.requests if low <= len(r.blocks) <= high]
        chosen = [picks[int(i)] for i in rng.integers(0, len(picks), min(100, len(picks)))]
        out[name] = [array.array("Q", workload.blocks.seq(r.blocks).tobytes()) for r in chosen]
    return out


def time_apply(index, batch) -> float:
    """CPU seconds of one apply_many call, which must apply cleanly."""
    cpu = time.process_time()
    outcomes = index.apply_many(batch)
    cpu = time.process_time() - cpu
    if any(o.status != "applied" or o.unknown_removals for o in outcomes):
        raise SystemExit("a batch was not cleanly applied")
    return cpu


def interleaved(cores: dict, workload, chunks, mode: str) -> tuple[dict, dict, list[int]]:
    """Every build applies the stream to an index of its own, chunk by chunk in turn
    (the order swapped each chunk), so that each chunk's times are taken within a
    fraction of a second of each other: per build, CPU ms per chunk."""
    indexes = {name: core.PrefixIndex(trace_bench.BLOCK_SIZE) for name, core in cores.items()}
    streams = {
        name: trace_bench.kvrouter_chunks(workload.blocks, chunks, mode, core)
        for name, core in cores.items()
    }
    cpu_ms: dict[str, list[float]] = {name: [] for name in cores}
    sizes = []
    for number in range(len(chunks)):
        batches = {name: next(stream) for name, stream in streams.items()}
        order = list(cores) if number % 2 == 0 else list(reversed(cores))
        for name in order:
            cpu_ms[name].append(time_apply(indexes[name], batches[name]) * 1e3)
        sizes.append(indexes[order[0]].stats()["blocks"])
    return indexes, cpu_ms, sizes


def finds_us(indexes: dict, queries: dict) -> dict[str, dict[str, float]]:
    """Per build and prompt class, the median over alternations of the p50 latency."""
    samples = {name: {c: [] for c in queries} for name in indexes}
    for _ in range(FIND_ROUNDS):
        for name, index in indexes.items():
            for c, q in queries.items():
                p50 = trace_bench.timed(index.find_matches, q, FIND_SECONDS)["p50_us"]
                samples[name][c].append(p50)
    return {
        name: {c: statistics.median(v) for c, v in by_class.items()}
        for name, by_class in samples.items()
    }


def summary(cpu: list[float], blocks: list[int], sizes: list[int]) -> dict:
    p50 = statistics.median(cpu)
    worst = int(np.argmax(cpu))
    return {
        "p50_ms": p50,
        "max_ms": cpu[worst],
        "max_over_p50": cpu[worst] / p50,
        "worst_chunk": worst,
        "worst_chunk_index_blocks": sizes[worst],
        "seconds": sum(cpu) / 1e3,
        "mblocks_s": sum(blocks) / sum(cpu) / 1e3,
        "chunk_cpu_ms": cpu,
    }


def rss_per_block(core, workload, chunks, mode: str) -> float:
    """RSS growth per block of the index, built alone."""
    before = trace_bench.rss_bytes()
    _, _, sizes = trace_bench.run_kvrouter(
        trace_bench.kvrouter_chunks(workload.blocks, chunks, mode, core), core
    )
    return (trace_bench.rss_bytes() - before) / sizes[-1]


def report(result: dict, first: str, memory: bool) -> str:
    finds = "/".join(f"{us:.2f}" for us in result["find_p50_us"].values())
    rss = f", {result['rss_bytes_per_block']:.1f} B/block" if memory else ""
    return (
        f"{result['build']:>8} {result['mode']:>6}: max/p50 {result['max_over_p50']:.2f} "
        f"({result['max_ms']:.0f}/{result['p50_ms']:.1f} ms, chunk {result['worst_chunk']} "
        f"at {result['worst_chunk_index_blocks']:,} blocks), {result['mblocks_s']:.2f} M "
        f"blocks/s, chunk time x{first} {result['median_chunk_ratio']:.3f}, find p50 us "
        f"{finds}{rss}, load {result['load_avg']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--core", action="append", required=True, help="NAME=PATH of a build")
    parser.add_argument(
        "--memory", action="store_true", help="also RSS per block, each build alone"
    )
    parser.add_argument("--scale", choices=SCALES, default="10M", help="the trace bench's scale")
    parser.add_argument("--trace", type=Path, default=trace_bench.SHARED_TRACE)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    paths = dict(spec.split("=", 1) for spec in args.core)
    cores = {name: load_core(name, Path(path)) for name, path in paths.items()}
    first = next(iter(cores))
    scale = SCALES[args.scale]
    rows = trace_workload.read_trace(args.trace)
    workload = trace_workload.build(
        rows, workers=scale.workers, capacity=scale.capacity, tile=scale.tile, seed=args.seed
    )
    chunks = trace_bench.chunked(workload)
    blocks = trace_bench.chunk_blocks(chunks)
    queries = find_queries(workload, args.seed)
    runs = []
    load_at_start = os.getloadavg()
    started = time.perf_counter()
    for mode in ("seq", "opaque"):
        indexes, cpu_ms, sizes = interleaved(cores, workload, chunks, mode)
        finds = finds_us(indexes, queries)
        del indexes
        load = os.getloadavg()[0]
        for name in cores:
            result = {"build": name, "mode": mode, "load_avg": load}
            result |= summary(cpu_ms[name], blocks, sizes)
            result["find_p50_us"] = finds[name]
            result["chunk_index_blocks"] = sizes
            # Paired by chunk: this build's time over the first build's.
            result["median_chunk_ratio"] = statistics.median(
                t / f for t, f in zip(cpu_ms[name], cpu_ms[first], strict=True)
            )
            if args.memory:
                result["rss_bytes_per_block"] = rss_per_block(cores[name], workload, chunks, mode)
            runs.append(result)
            print(report(result, first, args.memory), flush=True)
    out = {
        "scale": scale.name,
        "events": sum(len(c) for c in chunks),
        "blocks": sum(blocks),
        "chunk_blocks": blocks,
        "builds": paths,
        "load_avg_at_start": load_at_start,
        "load_avg_at_end": os.getloadavg(),
        "runs": runs,
        "seconds": time.perf_counter() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\n{out['seconds']:.0f} s; results in {args.out}")


if __name__ == "__main__":
    main()
