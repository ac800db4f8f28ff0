"""The index on a Mooncake-format trace: events from per-worker LRU caches (trace_workload).

For each cache size it applies the same event stream, in chunks of 1,024 events
(one apply_many call each), to kvrouter with its own hashes as engine ids, to
kvrouter with opaque engine ids (what vLLM and SGLang send), and to Dynamo's
RadixTree (JSON KvCacheEvent bytes, opaque ids). Kvrouter's index is first given
room for the workers' capacity, as the service's router gives it when they
register ("kvrouter/seq", "kvrouter/opaque"), and also runs without it
(", grown"), its tables doubling as they fill. Each chunk ends with one
fresh-block event of its own, so that Dynamo's background applier can be timed
per chunk: the clock stops once that block is visible. On the final state of the
largest run Dynamo also ran (it is skipped where its tree would not fit) it times
find_matches for short, medium and long prompts of the trace, and find throughput
while another thread applies events.
"""

from __future__ import annotations

import array
import ctypes
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import trace_workload
from dynamo import _core as dynamo

import kvrouter
from kvrouter import PrefixIndex

CHUNK_EVENTS = 1_024
BLOCK_SIZE = trace_workload.BLOCK_SIZE
# Prompt classes by length in blocks of 16 tokens: up to 2k tokens, up to 16k, longer.
PROMPT_CLASSES = (("short", 1, 128), ("medium", 129, 1_024), ("long", 1_025, 1 << 30))
SENTINEL_BASE = 1 << 50
SHARED_TRACE = (
    Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "synthetic_trace.jsonl"
)


@dataclass(frozen=True)
class TraceScale:
    """`workers` LRU caches of `capacity` blocks each, on the trace tiled `tile` times."""

    name: str
    workers: int
    capacity: int
    tile: int


FULL_SCALES = (
    TraceScale("100k", 32, 4_096, 1),
    TraceScale("1M", 32, 32_768, 2),
    TraceScale("10M", 32, 327_680, 8),
)
# Dynamo runs at a scale only if its tree, estimated from the bytes per block it took
# at the scale before, fits in this much (the machine is shared).
DYNAMO_MEMORY_GIB = 6.0
QUICK_SCALES = (TraceScale("100k", 32, 4_096, 1),)


def chunked(workload: trace_workload.TraceWorkload) -> list[list[trace_workload.TraceEvent]]:
    """The events in chunks of CHUNK_EVENTS, each closed by a one-block store of a fresh block."""
    chunks = []
    next_seq = [0] * workload.workers
    events = workload.events
    for number, start in enumerate(range(0, len(events), CHUNK_EVENTS)):
        chunk = []
        for e in events[start : start + CHUNK_EVENTS]:
            chunk.append(
                trace_workload.TraceEvent(
                    e.worker, next_seq[e.worker], e.stored, e.blocks, e.parent
                )
            )
            next_seq[e.worker] += 1
        worker = chunk[-1].worker
        sentinel = np.array([SENTINEL_BASE + number], dtype=np.int64)
        chunk.append(trace_workload.TraceEvent(worker, next_seq[worker], True, sentinel))
        next_seq[worker] += 1
        chunks.append(chunk)
    return chunks


def ids_of(blocks: trace_workload.TraceBlocks, mode: str, numbers: np.ndarray) -> np.ndarray:
    return seq_of(blocks, numbers) if mode == "seq" else blocks.opaque(numbers.astype(np.uint64))


def seq_of(blocks: trace_workload.TraceBlocks, numbers: np.ndarray) -> np.ndarray:
    """Sequence hashes; a sentinel is a root block, its hash chained from nothing."""
    if len(numbers) == 1 and numbers[0] >= SENTINEL_BASE:
        return np.array(
            kvrouter.chain_hashes(blocks.local(numbers.astype(np.uint64))), dtype=np.uint64
        )
    return blocks.seq(numbers)


def kvrouter_event(
    blocks: trace_workload.TraceBlocks, e: trace_workload.TraceEvent, mode: str, core=kvrouter
):
    """The event as kvrouter (or another build's `core` module) takes it, engine ids in
    `mode` ("seq" or "opaque")."""
    ids = ids_of(blocks, mode, e.blocks)
    if not e.stored:
        return core.Removed(ids)
    parent = int(ids_of(blocks, mode, np.array([e.parent]))[0]) if e.parent >= 0 else None
    return core.Stored(ids, local_hashes=blocks.local(e.blocks.astype(np.uint64)), parent=parent)


def kvrouter_chunks(blocks, chunks, mode: str, core=kvrouter) -> Iterator[list[tuple]]:
    """Built a chunk at a time, between timed calls, so that a big stream's events never
    all exist at once."""
    for chunk in chunks:
        yield [(e.worker, e.seq, [kvrouter_event(blocks, e, mode, core)]) for e in chunk]


def dynamo_payload(blocks: trace_workload.TraceBlocks, e: trace_workload.TraceEvent) -> bytes:
    """The event as Dynamo's RadixTree takes it: KvCacheEvent JSON with opaque ids."""
    ids = blocks.opaque(e.blocks.astype(np.uint64)).tolist()
    if not e.stored:
        data = f'{{"removed":{{"block_hashes":[{",".join(map(str, ids))}]}}}}'
    else:
        parent = (
            str(int(blocks.opaque(np.array([e.parent], dtype=np.uint64))[0]))
            if e.parent >= 0
            else "null"
        )
        local = blocks.local(e.blocks.astype(np.uint64)).tolist()
        body = ",".join(
            f'{{"block_hash":{b},"tokens_hash":{t}}}' for b, t in zip(ids, local, strict=True)
        )
        data = f'{{"stored":{{"parent_hash":{parent},"blocks":[{body}]}}}}'
    return f'{{"event_id":{e.seq},"data":{data}}}'.encode()


def dynamo_chunks(blocks, chunks) -> Iterator[list[tuple[int, bytes]]]:
    for chunk in chunks:
        yield [(e.worker, dynamo_payload(blocks, e)) for e in chunk]


def rss_bytes() -> int:
    """Resident memory after returning freed heap to the OS."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def chunk_blocks(chunks) -> list[int]:
    return [sum(len(e.blocks) for e in chunk) for chunk in chunks]


@dataclass
class Clocks:
    """Per chunk: wall seconds, and CPU seconds of the index's own work. On a
    machine shared with other jobs the CPU time is the steadier of the two."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


def run_kvrouter(
    batches, core=kvrouter, reserve_blocks: int = 0
) -> tuple[PrefixIndex, Clocks, list[int]]:
    """`reserve_blocks`: the room made before the first event, as a router makes
    it for its registered workers' capacity; 0 lets the tables grow as they fill."""
    index = core.PrefixIndex(BLOCK_SIZE)
    index.reserve(reserve_blocks)
    clocks, sizes = Clocks(), []
    for chunk in batches:
        start, cpu = time.perf_counter(), time.process_time()
        outcomes = index.apply_many(chunk)
        clocks.wall.append(time.perf_counter() - start)
        clocks.cpu.append(time.process_time() - cpu)
        bad = [o for o in outcomes if o.status != "applied" or o.unknown_removals]
        if bad:
            raise SystemExit(f"kvrouter: {len(bad)} batches not cleanly applied, e.g. {bad[0]!r}")
        sizes.append(index.stats()["blocks"])
    return index, clocks, sizes


def run_dynamo(blocks, inputs, chunks) -> tuple[object, Clocks]:
    """Dynamo applies on a background thread: its CPU time is the whole
    process's, less what this thread spends polling for the chunk's last block."""
    tree = dynamo.RadixTree()
    clocks = Clocks()
    for chunk_inputs, chunk in zip(inputs, chunks, strict=True):
        last = chunk[-1]
        probe = blocks.local(last.blocks.astype(np.uint64)).tolist()
        start, cpu = time.perf_counter(), time.process_time()
        for worker, payload in chunk_inputs:
            tree.apply_event(worker, payload)
        polling = time.thread_time()
        while tree.find_matches(probe).scores.get((last.worker, 0), 0) < 1:
            time.sleep(0)
        polling = time.thread_time() - polling
        clocks.wall.append(time.perf_counter() - start)
        clocks.cpu.append(time.process_time() - cpu - polling)
    return tree, clocks


def distribution_ms(seconds: list[float]) -> dict:
    ms = sorted(s * 1e3 for s in seconds)
    p50 = statistics.median(ms)
    return {
        "p50_ms": p50,
        "p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))],
        "max_ms": ms[-1],
        "max_over_p50": ms[-1] / p50,
    }


def rates(seconds: list[float], blocks: list[int], sizes: list[int]) -> dict:
    """M blocks/s filling the index (chunks before it stopped growing) and under churn."""
    peak = max(sizes)
    fill = [i for i, s in enumerate(sizes) if s < 0.95 * peak and (i == 0 or sizes[i - 1] < s)]
    fill = fill or [0]
    churn = [i for i in range(len(sizes)) if i > max(fill)] or list(range(len(sizes)))

    def rate(ix: list[int]) -> float:
        return sum(blocks[i] for i in ix) / sum(seconds[i] for i in ix) / 1e6

    return {
        "fill_mblocks_s": rate(fill),
        "churn_mblocks_s": rate(churn),
        "all_mblocks_s": rate(range(len(sizes))),
    }


def same_state(index: PrefixIndex, tree, blocks, mode: str, probes) -> None:
    for path in probes:
        ours = dict(index.find_matches(ids_of(blocks, "seq", path).tolist()).scores)
        theirs = {
            w: d
            for (w, _), d in tree.find_matches(
                blocks.local(path.astype(np.uint64)).tolist()
            ).scores.items()
        }
        if ours != theirs:
            raise SystemExit(f"trace {mode}: indexes disagree on a probe: {ours} vs {theirs}")


def run_kvrouters(workload, chunks, blocks, fleet_blocks: int, keep: bool):
    """Every kvrouter system applies the stream: per system its measurements, and the
    reserved indexes by mode when `keep`."""
    systems, kept = {}, {}
    for mode in ("seq", "opaque"):
        # As the service runs it, sized for its workers' capacity when they register;
        # then an index given no capacity, its tables doubling as it fills.
        for name, reserve in ((f"kvrouter/{mode}", fleet_blocks), (f"kvrouter/{mode}, grown", 0)):
            index, clocks, sizes = run_kvrouter(
                kvrouter_chunks(workload.blocks, chunks, mode), reserve_blocks=reserve
            )
            systems[name] = {
                **measured(clocks, blocks, sizes),
                "index_blocks": sizes[-1],
                "reserved_blocks": reserve,
                "table_bytes": index.stats()["table_bytes"],
            }
            if keep and reserve:
                kept[mode] = index
            del index
    return systems, kept, sizes


def bench_scale(
    rows, scale: TraceScale, seed: int, dynamo_bytes_per_block: float | None, repeats: int
):
    """The stream applied by every system `repeats` times, in turn; the first repeat's
    measurements in full, and every repeat's ratios to Dynamo over the whole stream."""
    workload = trace_workload.build(
        rows, workers=scale.workers, capacity=scale.capacity, tile=scale.tile, seed=seed
    )
    chunks = chunked(workload)
    blocks = chunk_blocks(chunks)
    results: dict = {
        "scale": scale.name,
        "workers": scale.workers,
        "capacity_blocks": scale.capacity,
        "tile": scale.tile,
        "requests": len(workload.requests),
        "events": sum(len(c) for c in chunks),
        "blocks_stored": workload.blocks_stored,
        "blocks_removed": workload.blocks_removed,
    }
    rng = np.random.default_rng(seed)
    probes = [
        workload.requests[int(i)].blocks
        for i in rng.integers(len(workload.requests) // 2, len(workload.requests), 200)
    ]
    fleet_blocks = scale.workers * scale.capacity
    results["systems"], indexes, sizes = run_kvrouters(
        workload, chunks, blocks, fleet_blocks, keep=True
    )
    if dynamo_bytes_per_block is not None:
        # The first repeat's tree stays for the finds while a later repeat builds its own.
        need = dynamo_bytes_per_block * sizes[-1] * (2 if repeats > 1 else 1)
        if need > DYNAMO_MEMORY_GIB * 2**30:
            reason = (
                f"its trees would take about {need / 2**30:.1f} GiB "
                f"({dynamo_bytes_per_block:.0f} bytes per block at the scale before), "
                f"over the {DYNAMO_MEMORY_GIB:g} GiB this bench allows it"
            )
            print(f"trace {scale.name}: Dynamo skipped: {reason}", file=sys.stderr)
            results["systems"]["dynamo"] = {"skipped": reason}
            return results, None
    before = rss_bytes()
    tree, clocks = run_dynamo(workload.blocks, dynamo_chunks(workload.blocks, chunks), chunks)
    results["dynamo_rss_growth_bytes"] = rss_bytes() - before
    results["dynamo_bytes_per_block"] = results["dynamo_rss_growth_bytes"] / sizes[-1]
    results["systems"]["dynamo"] = measured(clocks, blocks, sizes)
    for mode, index in indexes.items():
        same_state(index, tree, workload.blocks, mode, probes)
    results["checked_probes"] = len(probes)
    with_ratios(results["systems"])
    results["x_dynamo_all_repeats"] = [ratios_all(results["systems"])]
    for _ in range(repeats - 1):
        systems, _, _ = run_kvrouters(workload, chunks, blocks, fleet_blocks, keep=False)
        repeated, clocks = run_dynamo(
            workload.blocks, dynamo_chunks(workload.blocks, chunks), chunks
        )
        del repeated
        systems["dynamo"] = measured(clocks, blocks, sizes)
        with_ratios(systems)
        results["x_dynamo_all_repeats"].append(ratios_all(systems))
    results["x_dynamo_all_median"] = {
        name: statistics.median(r[name] for r in results["x_dynamo_all_repeats"])
        for name in results["x_dynamo_all_repeats"][0]
    }
    return results, (workload, indexes["seq"], tree)


def with_ratios(systems: dict) -> None:
    """Adds each kvrouter system's rates over Dynamo's, per clock and phase."""
    dyn = systems["dynamo"]
    for name, system in systems.items():
        if name != "dynamo":
            for clock in ("cpu", "wall"):
                for phase in ("fill", "churn", "all"):
                    key = f"{phase}_mblocks_s"
                    system[clock][f"x_dynamo_{phase}"] = system[clock][key] / dyn[clock][key]


def ratios_all(systems: dict) -> dict[str, float]:
    """Each kvrouter system's CPU-time rate over the whole stream over Dynamo's."""
    return {name: s["cpu"]["x_dynamo_all"] for name, s in systems.items() if name != "dynamo"}


def measured(clocks: Clocks, blocks: list[int], sizes: list[int]) -> dict:
    return {
        clock: {
            "chunks": distribution_ms(seconds),
            **rates(seconds, blocks, sizes),
            "seconds": sum(seconds),
        }
        for clock, seconds in (("cpu", clocks.cpu), ("wall", clocks.wall))
    }


def latency_us(samples_ns: list[int]) -> dict:
    s = sorted(samples_ns)
    return {
        "p50_us": s[len(s) // 2] / 1e3,
        "p99_us": s[min(len(s) - 1, int(0.99 * len(s)))] / 1e3,
        "samples": len(s),
    }


def timed(find, queries, seconds: float) -> dict:
    samples = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for q in queries:
            start = time.perf_counter_ns()
            find(q)
            samples.append(time.perf_counter_ns() - start)
    return latency_us(samples)


def bench_finds(workload, index: PrefixIndex, tree, seconds: float, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for name, low, high in PROMPT_CLASSES:
        picks = [r for r in workload.requests if low <= len(r.blocks) <= high]
        if not picks:
            continue
        chosen = [picks[int(i)] for i in rng.integers(0, len(picks), min(100, len(picks)))]
        ours = [workload.blocks.seq(r.blocks) for r in chosen]
        as_list = [q.tolist() for q in ours]
        as_array = [array.array("Q", q.tobytes()) for q in ours]
        theirs = [workload.blocks.local(r.blocks.astype(np.uint64)).tolist() for r in chosen]
        # The trace's blocks stand for tokens nobody has: token buffers of the same
        # lengths miss at their first block, so this times reading and hashing them.
        tokens = [rng.integers(0, 1 << 31, len(q) * BLOCK_SIZE, dtype=np.uint32) for q in as_list]
        row = {
            "prompt": name,
            "mean_blocks": statistics.mean(len(q) for q in as_list),
            "kvrouter_list": timed(index.find_matches, as_list, seconds),
            "kvrouter_array": timed(index.find_matches, as_array, seconds),
            # The same call on an empty index: converting the list, and no walk.
            "kvrouter_list_conversion": timed(
                PrefixIndex(BLOCK_SIZE).find_matches, as_list, seconds
            ),
            "kvrouter_tokens_hashing": timed(index.find_matches_for_tokens, tokens, seconds),
            "dynamo_list": timed(tree.find_matches, theirs, seconds),
        }
        row["list_conversion_share"] = (
            row["kvrouter_list_conversion"]["p50_us"] / row["kvrouter_list"]["p50_us"]
        )
        row["x_p50_list"] = row["dynamo_list"]["p50_us"] / row["kvrouter_list"]["p50_us"]
        row["x_p50_array"] = row["dynamo_list"]["p50_us"] / row["kvrouter_array"]["p50_us"]
        row["x_p99_list"] = row["dynamo_list"]["p99_us"] / row["kvrouter_list"]["p99_us"]
        rows.append(row)
    return rows


def finds_per_s(index: PrefixIndex, queries, threads: int, seconds: float) -> float:
    counts = [0] * threads
    stop = time.perf_counter() + seconds

    def loop(slot: int) -> None:
        n = 0
        while time.perf_counter() < stop:
            for q in queries:
                index.find_matches(q)
            n += len(queries)
        counts[slot] = n

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return sum(counts) / seconds


def bench_concurrency(workload, index: PrefixIndex, seed: int, seconds: float) -> dict:
    """Find throughput alone (1 and 2 threads), and while a thread applies the stream anew."""
    rng = np.random.default_rng(seed)
    picks = [r for r in workload.requests if 129 <= len(r.blocks) <= 1_024] or workload.requests
    queries = [
        array.array("Q", workload.blocks.seq(picks[int(i)].blocks).tobytes())
        for i in rng.integers(0, len(picks), 64)
    ]
    alone = {threads: finds_per_s(index, queries, threads, seconds) for threads in (1, 2)}
    batches = list(kvrouter_chunks(workload.blocks, chunked(workload), "seq"))
    target = PrefixIndex(BLOCK_SIZE)
    start = time.perf_counter()
    for chunk in batches:
        target.apply_many(chunk)
    apply_alone_s = time.perf_counter() - start
    target = PrefixIndex(BLOCK_SIZE)
    applied = {}

    def apply_all() -> None:
        began = time.perf_counter()
        for chunk in batches:
            target.apply_many(chunk)
        applied["seconds"] = time.perf_counter() - began

    applier = threading.Thread(target=apply_all)
    applier.start()
    during = finds_per_s(index, queries, 1, min(seconds, apply_alone_s))
    applier.join()
    return {
        "queries": "medium prompts, array('Q')",
        "finds_per_s_1_thread": alone[1],
        "finds_per_s_2_threads": alone[2],
        "finds_per_s_1_thread_while_applying": during,
        "apply_alone_s": apply_alone_s,
        "apply_while_finding_s": applied["seconds"],
    }


def bench_trace(path: Path, quick: bool, seed: int, repeats: int) -> dict:
    rows = trace_workload.read_trace(path)
    scales = QUICK_SCALES if quick else FULL_SCALES
    out: dict = {"trace": str(path), "trace_requests": len(rows), "repeats": repeats, "scales": []}
    compared, bytes_per_block = None, None
    for scale in scales:
        result, state = bench_scale(rows, scale, seed, bytes_per_block, repeats)
        out["scales"].append(result)
        if state is not None:
            compared, bytes_per_block = state, result["dynamo_bytes_per_block"]
            out["finds_on"] = scale.name
        del state
    workload, index, tree = compared
    out["find_matches"] = bench_finds(workload, index, tree, 0.3 if quick else 1.5, seed)
    out["concurrency"] = bench_concurrency(workload, index, seed, 0.5 if quick else 2.0)
    return out


def report(results: dict, table, fmt) -> str:
    parts = []
    rows = []
    for s in results["scales"]:
        for name, system in s["systems"].items():
            if "skipped" in system:
                rows.append([s["scale"], "", name, "", "skipped: " + system["skipped"]] + [""] * 9)
                continue
            for clock in ("cpu", "wall"):
                sy = system[clock]
                c = sy["chunks"]
                ratios = [
                    fmt(sy[f"x_dynamo_{phase}"], 2) + "x" if f"x_dynamo_{phase}" in sy else ""
                    for phase in ("fill", "churn", "all")
                ]
                tables = system.get("table_bytes")
                rows.append(
                    [
                        s["scale"],
                        f"{s['systems']['kvrouter/seq']['index_blocks']:,}",
                        name,
                        fmt(tables / 2**20, 0) if tables and clock == "cpu" else "",
                        clock,
                        fmt(sy["fill_mblocks_s"], 2),
                        fmt(sy["churn_mblocks_s"], 2),
                        fmt(c["p50_ms"]),
                        fmt(c["p99_ms"]),
                        fmt(c["max_ms"]),
                        fmt(c["max_over_p50"], 2),
                        *ratios,
                    ]
                )
    head = results["scales"][-1]
    parts.append(
        f"Trace apply ({results['trace']}, chunks of {CHUNK_EVENTS:,} events; largest run: "
        f"{head['events']:,} events, {head['blocks_stored']:,} blocks stored, "
        f"{head['blocks_removed']:,} removed)\n"
        + table(
            [
                "scale",
                "index blocks",
                "system",
                "tables MiB",
                "clock",
                "fill M/s",
                "churn M/s",
                "chunk p50 ms",
                "p99",
                "max",
                "max/p50",
                "x fill",
                "x churn",
                "x all",
            ],
            rows,
        )
    )
    rows = [
        [s["scale"], name]
        + [fmt(r[name], 2) + "x" for r in s["x_dynamo_all_repeats"]]
        + [fmt(median, 2) + "x"]
        for s in results["scales"]
        if "x_dynamo_all_median" in s
        for name, median in s["x_dynamo_all_median"].items()
    ]
    repeats = results["repeats"]
    parts.append(
        "Trace apply over the whole stream, CPU time, x Dynamo: each repeat and the median\n"
        + table(
            ["scale", "system"] + [f"repeat {r + 1}" for r in range(repeats)] + ["median"], rows
        )
    )
    rows = [
        [
            r["prompt"],
            fmt(r["mean_blocks"], 0),
            fmt(r["kvrouter_list"]["p50_us"]),
            fmt(r["kvrouter_list"]["p99_us"]),
            fmt(r["kvrouter_array"]["p50_us"]),
            fmt(r["kvrouter_array"]["p99_us"]),
            fmt(r["dynamo_list"]["p50_us"]),
            fmt(r["dynamo_list"]["p99_us"]),
            fmt(r["x_p50_list"], 2) + "x",
            fmt(r["x_p50_array"], 2) + "x",
            fmt(r["kvrouter_list_conversion"]["p50_us"]),
            fmt(100 * r["list_conversion_share"], 0) + "%",
            fmt(r["kvrouter_tokens_hashing"]["p50_us"]),
        ]
        for r in results["find_matches"]
    ]
    parts.append(
        f"Trace find_matches on the {results['finds_on']} run's final index, us\n"
        + table(
            [
                "prompt",
                "blocks",
                "ours list p50",
                "p99",
                "ours array p50",
                "p99",
                "dynamo p50",
                "p99",
                "x list",
                "x array",
                "list conversion p50",
                "of list p50",
                "tokens read+hash p50",
            ],
            rows,
        )
    )
    c = results["concurrency"]
    parts.append(
        "Finds while applying (medium prompts, array('Q')): "
        f"{fmt(c['finds_per_s_1_thread'], 0)}/s on 1 thread, "
        f"{fmt(c['finds_per_s_2_threads'], 0)}/s on 2, "
        f"{fmt(c['finds_per_s_1_thread_while_applying'], 0)}/s on 1 while another thread applies; "
        f"apply {c['apply_alone_s']:.2f} s alone, {c['apply_while_finding_s']:.2f} s alongside"
    )
    return "\n\n".join(parts)
