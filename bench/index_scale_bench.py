"""The index at scale: thousands of simulated workers on a Mooncake trace's request stream.

In the manner of Dynamo's mooncake_bench (lib/kv-router/src/indexer/INDEXER_BENCH.md):
`--unique-workers` LRU caches are fed the trace, tiled `--tile` times with fresh ids
(bench/trace_workload.py: each request goes to the worker caching its longest prefix),
and each is replicated until there are `workers` simulated workers (Dynamo's `-d`):
every copy stores and removes the same blocks and issues the same requests, a fraction
of an op's gap after the copy before it. As in Dynamo's bench a trace hash id is one
block (`--blocks-per-hash-id 32` makes it 32 blocks of 16 tokens). An op is one
find_matches call (a request) or one KV event, so N workers offer N/unique times the
ops; past `--max-ops` only the stream's first part is replayed.

The op stream is replayed open loop, compressed in time so that it is offered at a given
rate. Events run on one thread: kvrouter applies the events due, at most APPLY_BATCHES
per apply_many call (a router draining its queue); Dynamo gets one apply_event call each
and applies them on its own background thread. Finds run on the main thread at their
scheduled times. A find's latency runs from its scheduled time to its return, so a
driver that falls behind is counted. A rate is sustained when the last op completes
within SLACK of the window's end (events included: Dynamo's clock stops once a final
event of its own is visible). The sweep starts at `--start-rate` and doubles while the
rate is kept up, or halves until it is; the report gives the highest rate kept up with
the find p99 within each target, from the scheduled time and of the call alone.

    .venv/bin/python bench/index_scale_bench.py  # ~7 minutes
    ... --workers 1000 10000 --ids seq      # a subset
    ... --quick                              # 1,000 and 10,000 workers, one copy of the trace
"""

from __future__ import annotations

import argparse
import array
import bisect
import ctypes
import gc
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import index_trace_bench
import numpy as np
import trace_workload
from dynamo import _core as dynamo

from kvrouter import PrefixIndex

RESULTS = Path(__file__).resolve().parent / "results" / "index_scale.json"
SHARED_TRACE = (
    Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "synthetic_trace.jsonl"
)
# Dynamo's published sharded indexer: 30.4k ops/s at p99 3.2 ms with 7,000 workers.
TARGET_OPS_S = 30_400
TARGET_P99_MS = 3.2
P99_TARGETS_MS = (0.5, 1.0, TARGET_P99_MS)
# Batches per apply_many call: each call holds the write lock, so finds wait at most one.
APPLY_BATCHES = 8
SLACK = 1.03
# The sweep halves the rate no further than a window of this long.
MAX_WINDOW_S = 30.0
# Python threads hand the GIL over every 5 ms by default; a find would wait that long
# behind the events thread's Python work, for either system.
SWITCH_INTERVAL_S = 0.0002
SENTINEL_BLOCK = np.array([1 << 50], dtype=np.int64)


@dataclass
class Load:
    """One system's op stream for one worker count; times are fractions of the window."""

    find_times: list[float]
    finds: list[object]
    event_times: list[float]
    events: list[tuple]

    @property
    def ops(self) -> int:
        return len(self.finds) + len(self.events)


def kept_requests(request_ms: list[int], event_ms: list[int], copies: int, max_ops: int) -> int:
    """How many of the first requests (with the events up to the last one's time) fit."""

    def ops(keep: int) -> int:
        return copies * (keep + bisect.bisect_right(event_ms, request_ms[keep - 1]))

    low, high = 1, len(request_ms)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if ops(mid) <= max_ops else (low, mid - 1)
    return low


def load_for(
    workload: trace_workload.TraceWorkload, copies: int, queries, events, max_ops: int
) -> Load:
    """The unique workers' requests and events, each issued by all `copies` of its worker,
    up to the time where they make `max_ops` ops."""
    request_ms = [r.timestamp_ms for r in workload.requests]
    event_ms = [e.timestamp_ms for e in workload.events]
    keep = kept_requests(request_ms, event_ms, copies, max_ops)
    first, last = request_ms[0], request_ms[keep - 1]
    kept_events = bisect.bisect_right(event_ms, last)
    span = max(1, last - first)
    # Copy k runs k/copies of a mean op gap behind copy 0, so that the copies of one
    # request do not all arrive at once; each copy keeps its own order.
    gap = 1 / (keep + kept_events)
    shifts = [k * gap / copies for k in range(copies)]
    finds = sorted(
        ((t - first) / span + shift, r, shift)
        for r, t in enumerate(request_ms[:keep])
        for shift in shifts
    )
    unique = workload.workers
    events_at = sorted(
        ((event_ms[i] - first) / span + shifts[k], i, k)
        for i in range(kept_events)
        for k in range(copies)
    )
    end = max(finds[-1][0], events_at[-1][0] if events_at else 0.0)
    return Load(
        find_times=[t / end for t, _, _ in finds],
        finds=[queries[r] for _, r, _ in finds],
        event_times=[t / end for t, _, _ in events_at],
        events=[
            (k * unique + workload.events[i].worker, workload.events[i].seq, events[i])
            for _, i, k in events_at
        ],
    )


class Kvrouter:
    name = "kvrouter"

    def __init__(self, workload: trace_workload.TraceWorkload, mode: str):
        self.name = f"kvrouter/{mode}"
        blocks = workload.blocks
        self.queries = [array.array("Q", blocks.seq(r.blocks).tobytes()) for r in workload.requests]
        self.events = [[index_trace_bench.kvrouter_event(blocks, e, mode)] for e in workload.events]
        self.outcomes: list = []

    def new(self) -> PrefixIndex:
        self.outcomes = []
        return PrefixIndex(trace_workload.BLOCK_SIZE)

    def apply(self, index: PrefixIndex, events: list[tuple]) -> None:
        self.outcomes += index.apply_many(events)

    def find(self, index: PrefixIndex, query) -> None:
        index.find_matches(query)

    def settle(self, index: PrefixIndex, workers: int) -> None:
        bad = [o for o in self.outcomes if o.status != "applied" or o.unknown_removals]
        if bad:
            raise SystemExit(f"{self.name}: {len(bad)} batches not cleanly applied: {bad[0]!r}")

    def scores(self, index: PrefixIndex, request: trace_workload.TraceRequest, blocks) -> dict:
        return dict(index.find_matches(blocks.seq(request.blocks).tolist()).scores)


class Dynamo:
    name = "dynamo"

    def __init__(self, workload: trace_workload.TraceWorkload):
        blocks = workload.blocks
        self.queries = [
            blocks.local(r.blocks.astype(np.uint64)).tolist() for r in workload.requests
        ]
        self.events = [index_trace_bench.dynamo_payload(blocks, e) for e in workload.events]
        self.sentinel = blocks.local(SENTINEL_BLOCK.astype(np.uint64)).tolist()
        sentinel = trace_workload.TraceEvent(0, 0, True, SENTINEL_BLOCK)
        self.sentinel_payload = index_trace_bench.dynamo_payload(blocks, sentinel)

    def new(self):
        return dynamo.RadixTree()

    def apply(self, tree, events: list[tuple]) -> None:
        for worker, _seq, payload in events:
            tree.apply_event(worker, payload)

    def find(self, tree, query) -> None:
        tree.find_matches(query)

    def settle(self, tree, workers: int) -> None:
        """Its applier runs behind apply_event: wait for a last event of a fresh worker."""
        tree.apply_event(workers, self.sentinel_payload)
        while tree.find_matches(self.sentinel).scores.get((workers, 0), 0) < 1:
            time.sleep(0)

    def scores(self, tree, request: trace_workload.TraceRequest, blocks) -> dict:
        query = blocks.local(request.blocks.astype(np.uint64)).tolist()
        return {w: d for (w, _), d in tree.find_matches(query).scores.items()}


def wait_until(due: float) -> None:
    delay = due - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


@dataclass
class Replay:
    offered_ops_s: float
    achieved_ops_s: float
    sustained: bool
    find_p50_us: float
    find_p99_us: float
    find_max_us: float
    # The call alone, without the wait for its turn: what the index costs when
    # the driver's thread was not kept off the CPU.
    call_p99_us: float
    event_lag_p99_ms: float
    seconds: float
    extra: dict = field(default_factory=dict)


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def replay(system, load: Load, rate: float, workers: int) -> tuple[object, Replay]:
    window = load.ops / rate
    index = system.new()
    start = time.perf_counter() + 0.05
    finished: dict[str, float] = {}
    lags: list[float] = []

    def drive_events() -> None:
        times, events = load.event_times, load.events
        n, i = len(times), 0
        while i < n:
            due = start + times[i] * window
            wait_until(due)
            now = (time.perf_counter() - start) / window
            j = max(i + 1, bisect.bisect_right(times, now, i, min(n, i + APPLY_BATCHES)))
            system.apply(index, events[i:j])
            lags.append(time.perf_counter() - due)
            i = j
        system.settle(index, workers)
        finished["events"] = time.perf_counter()

    applier = threading.Thread(target=drive_events)
    applier.start()
    latencies, calls = array.array("d"), array.array("d")
    for t, query in zip(load.find_times, load.finds, strict=True):
        due = start + t * window
        wait_until(due)
        called = time.perf_counter()
        system.find(index, query)
        done = time.perf_counter()
        latencies.append(done - due)
        calls.append(done - called)
    finds_done = time.perf_counter()
    applier.join()
    elapsed = max(finds_done, finished["events"]) - start
    s = sorted(latencies)
    lags.sort()
    calls = sorted(calls)
    return index, Replay(
        offered_ops_s=rate,
        achieved_ops_s=load.ops / max(elapsed, window),
        sustained=elapsed <= SLACK * window,
        find_p50_us=percentile(s, 0.5) * 1e6,
        find_p99_us=percentile(s, 0.99) * 1e6,
        find_max_us=s[-1] * 1e6,
        call_p99_us=percentile(calls, 0.99) * 1e6,
        event_lag_p99_ms=percentile(lags, 0.99) * 1e3,
        seconds=elapsed,
    )


def rss_bytes() -> int:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(system, load: Load, rate: float, workers: int, check) -> Replay:
    gc.collect()
    before = rss_bytes()
    gc.disable()
    try:
        index, run = replay(system, load, rate, workers)
    finally:
        gc.enable()
    run.extra["rss_growth_bytes"] = rss_bytes() - before
    check(system, index)
    print(
        f"  {system.name:>16} {workers:>7,} workers {rate:>11,.0f} ops/s offered: "
        f"{run.achieved_ops_s:>11,.0f} achieved, find p99 {run.find_p99_us:,.0f} us "
        f"(call {run.call_p99_us:,.0f})"
        f"{'' if run.sustained else ' (behind)'}",
        file=sys.stderr,
    )
    return run


def sweep(system, load: Load, args, workers: int, check) -> dict:
    """From the start rate, doubling while the system keeps up (one more try after the
    first miss, for noise), or halving until it does (or the window would pass
    MAX_WINDOW_S). The p99 targets are read off the runs afterwards."""
    rate = args.start_rate
    runs = [measure(system, load, rate, workers, check)]
    if runs[-1].sustained:
        misses = 0
        while misses < 2 and rate * 2 <= args.max_rate:
            rate *= 2
            runs.append(measure(system, load, rate, workers, check))
            misses = 0 if runs[-1].sustained else misses + 1
    else:
        while load.ops / (rate / 2) <= MAX_WINDOW_S:
            rate /= 2
            runs.append(measure(system, load, rate, workers, check))
            if runs[-1].sustained:
                break
    runs.sort(key=lambda r: r.offered_ops_s)
    return {
        "runs": [r.__dict__ for r in runs],
        "rss_growth_bytes": runs[-1].extra["rss_growth_bytes"],
    }


def best_under(runs: list[dict], p99_ms: float, key: str) -> float:
    ok = [r["achieved_ops_s"] for r in runs if r["sustained"] and r[key] <= p99_ms * 1e3]
    return max(ok, default=0.0)


def bench(args) -> dict:
    rows = trace_workload.read_trace(args.trace, args.requests)
    started = time.perf_counter()
    workload = trace_workload.build(
        rows,
        workers=args.unique_workers,
        capacity=args.capacity,
        seed=args.seed,
        tile=args.tile,
        unit_tokens=args.blocks_per_hash_id * trace_workload.BLOCK_SIZE,
    )
    out: dict = {
        "trace": str(args.trace),
        "trace_requests": len(workload.requests),
        "unique_workers": args.unique_workers,
        "capacity_blocks": args.capacity,
        "tile": args.tile,
        "blocks_per_hash_id": args.blocks_per_hash_id,
        "unique_events": len(workload.events),
        "unique_blocks_stored": workload.blocks_stored,
        "unique_blocks_removed": workload.blocks_removed,
        "build_s": time.perf_counter() - started,
        "sizes": [],
    }
    systems = [Kvrouter(workload, mode) for mode in args.ids]
    peer = Dynamo(workload)
    rng = np.random.default_rng(args.seed)
    probes = [workload.requests[int(i)] for i in rng.integers(0, len(workload.requests), 100)]
    dynamo_bytes_per_copy = None
    for workers in sorted(args.workers):
        copies = max(1, workers // args.unique_workers)
        workers = copies * args.unique_workers
        size: dict = {"workers": workers, "copies": copies, "systems": {}}
        finals: dict = {}

        def check(system, index, finals=finals, copies=copies) -> None:
            answers = [system.scores(index, r, workload.blocks) for r in probes]
            if any(len(a) % copies for a in answers):
                raise SystemExit(f"{system.name}: a probe's holders are not whole copies")
            finals[system.name] = answers

        runners = list(systems)
        skip = dynamo_skip(args, workers, copies, dynamo_bytes_per_copy)
        if skip:
            size["systems"]["dynamo"] = {"skipped": skip}
            print(f"  dynamo at {workers:,} workers skipped: {skip}", file=sys.stderr)
        else:
            runners.append(peer)
        for system in runners:
            load = load_for(workload, copies, system.queries, system.events, args.max_ops)
            size["ops"] = load.ops
            size["finds"] = len(load.finds)
            size["events"] = len(load.events)
            size["requests_replayed"] = len(load.finds) // copies
            result = sweep(system, load, args, workers, check)
            result["ops_s_at_p99"] = {
                f"{ms:g}ms": best_under(result["runs"], ms, "find_p99_us") for ms in P99_TARGETS_MS
            }
            result["ops_s_at_call_p99"] = {
                f"{ms:g}ms": best_under(result["runs"], ms, "call_p99_us") for ms in P99_TARGETS_MS
            }
            size["systems"][system.name] = result
            del load
            if system is peer:
                dynamo_bytes_per_copy = result["rss_growth_bytes"] / copies
        names = list(finals)
        for name in names[1:]:
            if finals[name] != finals[names[0]]:
                raise SystemExit(f"{name} and {names[0]} disagree on a probe at {workers} workers")
        size["checked_probes"] = len(probes) if len(names) > 1 else 0
        out["sizes"].append(size)
    return out


def dynamo_skip(args, workers: int, copies: int, bytes_per_copy: float | None) -> str:
    if workers > args.dynamo_max_workers:
        return f"over --dynamo-max-workers {args.dynamo_max_workers:,}"
    if bytes_per_copy is not None:
        need = bytes_per_copy * copies
        if need > args.dynamo_memory_gib * 2**30:
            return (
                f"its tree would take about {need / 2**30:.1f} GiB "
                f"({bytes_per_copy / 2**20:.0f} MiB per copy of the unique workers), "
                f"over --dynamo-memory-gib {args.dynamo_memory_gib:g}"
            )
    return ""


def report(results: dict) -> str:
    rows = []
    for size in results["sizes"]:
        for name, system in size["systems"].items():
            if "skipped" in system:
                rows.append([f"{size['workers']:,}", name, "skipped: " + system["skipped"]])
                continue
            for r in system["runs"]:
                rows.append(
                    [
                        f"{size['workers']:,}",
                        name,
                        f"{r['offered_ops_s']:,.0f}",
                        f"{r['achieved_ops_s']:,.0f}",
                        f"{r['find_p50_us']:,.0f}",
                        f"{r['find_p99_us']:,.0f}",
                        f"{r['call_p99_us']:,.0f}",
                        f"{r['event_lag_p99_ms']:,.1f}",
                        "yes" if r["sustained"] else "no",
                        f"{r['extra']['rss_growth_bytes'] / 2**20:,.0f}",
                    ]
                )
    parts = [
        f"Scale ({results['trace']}: {results['trace_requests']:,} requests on "
        f"{results['unique_workers']:,} unique workers of {results['capacity_blocks']:,} blocks, "
        f"{results['unique_events']:,} events, {results['unique_blocks_stored']:,} blocks stored "
        f"and {results['unique_blocks_removed']:,} removed per copy)\n"
        + table(
            [
                "workers",
                "system",
                "offered ops/s",
                "achieved",
                "find p50 us",
                "p99 us",
                "call p99 us",
                "event lag p99 ms",
                "kept up",
                "RSS MiB",
            ],
            rows,
        )
    ]
    rows = []
    for size in results["sizes"]:
        for name, system in size["systems"].items():
            if "skipped" not in system:
                rows.append(
                    [f"{size['workers']:,}", f"{size['ops']:,}", name]
                    + [f"{v:,.0f}" for v in system["ops_s_at_p99"].values()]
                    + [f"{v:,.0f}" for v in system["ops_s_at_call_p99"].values()]
                )
    targets = [f"{ms:g} ms" for ms in P99_TARGETS_MS]
    parts.append(
        "Highest rate kept up with find p99 (from the scheduled time, then of the call) within\n"
        + table(["workers", "ops", "system"] + targets + [f"call {t}" for t in targets], rows)
    )
    return "\n\n".join(parts)


def table(headers: list[str], rows: list[list]) -> str:
    width = max(len(headers), max((len(r) for r in rows), default=0))
    cells = [headers + [""] * (width - len(headers))] + [r + [""] * (width - len(r)) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(width)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=SHARED_TRACE)
    parser.add_argument("--requests", type=int, help="only the trace's first N requests")
    parser.add_argument("--workers", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--unique-workers", type=int, default=1_000)
    parser.add_argument("--capacity", type=int, default=256, help="blocks per worker")
    parser.add_argument(
        "--blocks-per-hash-id",
        type=int,
        default=1,
        help="blocks per trace hash id: 1 as Dynamo's bench; 32 is 16-token blocks",
    )
    parser.add_argument("--start-rate", type=float, default=TARGET_OPS_S, help="offered ops/s")
    parser.add_argument("--max-rate", type=float, default=2_000_000)
    parser.add_argument("--tile", type=int, default=8, help="the trace repeated with fresh ids")
    parser.add_argument(
        "--max-ops", type=int, default=1_000_000, help="replay at most the stream's first N ops"
    )
    parser.add_argument("--ids", nargs="+", default=["seq", "opaque"], choices=["seq", "opaque"])
    parser.add_argument("--dynamo-max-workers", type=int, default=10_000)
    parser.add_argument("--dynamo-memory-gib", type=float, default=4.0)
    parser.add_argument(
        "--quick", action="store_true", help="1,000 and 10,000 workers, the trace once"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.workers = [w for w in args.workers if w <= 10_000]
        args.tile = 1
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    started = time.perf_counter()
    results = {"load_avg_at_start": os.getloadavg(), "cores": os.cpu_count(), **bench(args)}
    results["load_avg_at_end"] = os.getloadavg()
    results["seconds"] = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(report(results))
    print(
        f"\n{results['seconds']:.0f} s, load {results['load_avg_at_start'][0]:.1f} at the start "
        f"and {results['load_avg_at_end'][0]:.1f} at the end; results in {args.out}"
    )


if __name__ == "__main__":
    main()
