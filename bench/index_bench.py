"""Prefix index benchmark: kvrouter against NVIDIA Dynamo's KV router index, in one run.

On the same token blocks, events and queries it measures
  * hashing throughput: kvrouter.hash_tokens against dynamo compute_block_hash_for_seq;
  * event application throughput, timed until the events are fully applied (Dynamo's
    RadixTree applies them on a background thread, so its clock stops only once every
    worker's last stored sequence is visible to find_matches);
  * find_matches latency across workers x sequence length, with shared prefixes;
  * bytes per cached block from RSS, each system in a fresh subprocess.

Each system gets its input in the form its Python API takes: Dynamo JSON-encoded
KvCacheEvent bytes (its wire format; encoded before the clock starts) and lists of
its own local block hashes; kvrouter `Stored`/`Removed` events built, inside the timed
region, from numpy arrays, and lists of its sequence hashes.

    .venv/bin/python bench/index_bench.py            # full run, ~6 minutes on 2 cores
    .venv/bin/python bench/index_bench.py --quick    # smoke run, about a minute
    .venv/bin/python bench/index_bench.py --only trace --trace PATH   # a Mooncake trace
"""

from __future__ import annotations

import argparse
import array
import ctypes
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import index_trace_bench
import numpy as np
import psutil
from dynamo import _core as dynamo
from tqdm import tqdm

import kvrouter
from kvrouter import PrefixIndex, Removed, Stored

BLOCK_SIZE = 16
VOCAB = 150_000
HASH_TOKENS = (1_024, 16_384, 131_072)
MATCH_WORKERS = (8, 64, 512)
MATCH_BLOCKS = (128, 1_024, 8_192)
# Batches handed to one apply_many call: a router draining its event queue.
BULK_CHUNK = 1_024
RESULTS = Path(__file__).resolve().parent / "results" / "index_bench.json"
SHARED_TRACE = index_trace_bench.SHARED_TRACE

TARGET_SPEEDUP = 3.0
# Bytes per block after churn, as shares of Dynamo's: our hashes as engine ids, opaque ids.
TARGET_MEMORY_SHARES = {"kvrouter": 0.30, "kvrouter/opaque": 0.40}
TARGET_HASH_SPEEDUP = 4.0


@dataclass(frozen=True)
class Scale:
    hash_rounds: int
    hash_round_s: float
    stream_workers: int
    stream_conversations: int
    stream_capacity: int
    stream_repeats: int
    memory_conversations: int
    memory_capacity: int
    match_conversation_blocks: int
    match_queries: int
    match_rounds: int
    match_system_s: float
    match_setup_repeats: int


FULL = Scale(
    hash_rounds=7,
    hash_round_s=0.25,
    stream_workers=32,
    stream_conversations=3_000,
    stream_capacity=8_000,
    stream_repeats=9,
    memory_conversations=16_000,
    memory_capacity=32_000,
    match_conversation_blocks=300_000,
    match_queries=64,
    match_rounds=5,
    match_system_s=4.0,
    match_setup_repeats=5,
)
QUICK = Scale(
    hash_rounds=3,
    hash_round_s=0.05,
    stream_workers=16,
    stream_conversations=300,
    stream_capacity=3_000,
    stream_repeats=2,
    memory_conversations=600,
    memory_capacity=3_000,
    match_conversation_blocks=20_000,
    match_queries=16,
    match_rounds=2,
    match_system_s=0.25,
    match_setup_repeats=1,
)


@contextmanager
def gc_paused() -> Iterator[None]:
    """No collector pauses inside a timed region, for either system (as timeit does)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def progress(total: int, desc: str) -> tqdm:
    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)


# --------------------------------------------------------------------------- workloads


class BlockTable:
    """Every distinct block of a workload, with each system's name for it.

    Block `g` has its tokens, kvrouter's local and sequence hashes, Dynamo's local
    (tokens) hash, and the id a foreign engine would give it: opaque to both indexes.
    """

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self._tokens: list[np.ndarray] = []
        self._seq: list[int] = []
        self._local: list[int] = []
        self._dynamo: list[int] = []
        self._opaque: list[int] = []

    def extend(self, parent: int, blocks: int) -> np.ndarray:
        """Registers `blocks` fresh blocks continuing after block `parent` (-1: a root)."""
        tokens = self.rng.integers(0, VOCAB, blocks * BLOCK_SIZE, dtype=np.uint32)
        local = kvrouter.local_block_hashes(tokens, BLOCK_SIZE)
        chain_parent = self._seq[parent] if parent >= 0 else None
        first = len(self._seq)
        self._tokens.append(tokens.reshape(blocks, BLOCK_SIZE))
        self._local += local
        self._seq += kvrouter.chain_hashes(local, chain_parent)
        self._dynamo += dynamo.compute_block_hash_for_seq(tokens.tolist(), BLOCK_SIZE)
        self._opaque += self.rng.integers(0, 2**63, blocks, dtype=np.uint64).tolist()
        return np.arange(first, first + blocks)

    def freeze(self) -> None:
        self.tokens = np.concatenate(self._tokens)
        self.seq = np.array(self._seq, dtype=np.uint64)
        self.local = np.array(self._local, dtype=np.uint64)
        self.dynamo = np.array(self._dynamo, dtype=np.uint64)
        self.opaque = np.array(self._opaque, dtype=np.uint64)
        del self._tokens, self._seq, self._local, self._dynamo, self._opaque


@dataclass
class StreamEvent:
    """One event of one worker, naming blocks by their BlockTable index."""

    worker: int
    seq: int
    stored: bool
    blocks: np.ndarray
    parent: int = -1


@dataclass
class EventStream:
    table: BlockTable
    events: list[StreamEvent]
    workers: int
    # Per worker, the fresh sequence it stored last: once every one is visible,
    # every event was applied, however an index orders its work across threads.
    sentinels: list[tuple[int, np.ndarray]]
    # Paths workers hold at the end, to check both indexes against.
    probes: list[np.ndarray]
    unique_blocks: int
    holdings: int

    @property
    def blocks_applied(self) -> int:
        return sum(len(e.blocks) for e in self.events)


def append_sentinels(
    table: BlockTable, events: list[StreamEvent], next_seq: list[int]
) -> list[tuple[int, np.ndarray]]:
    sentinels = []
    for worker, seq in enumerate(next_seq):
        blocks = table.extend(-1, 8)
        events.append(StreamEvent(worker, seq, True, blocks))
        next_seq[worker] += 1
        sentinels.append((worker, blocks))
    return sentinels


def conversation_stream(
    rng: np.random.Generator, *, workers: int, conversations: int, capacity: int
) -> EventStream:
    """Multi-turn chat traffic on `workers` engines with prefix caching.

    Eight system prompts (32-256 blocks) are shared by all conversations. A
    conversation runs 1-8 turns of 4-48 blocks on a sticky worker that moves 10% of
    the time. Each turn the worker stores the blocks past its longest cached prefix
    (so a worker's first use of a system prompt stores it too); past `capacity`
    blocks it evicts its least recently used conversation, leaf first.
    """
    table = BlockTable(rng)
    systems = [table.extend(-1, int(rng.integers(32, 257))) for _ in range(8)]
    held: list[set[int]] = [set() for _ in range(workers)]
    # Per worker, its conversations in LRU order: (system prompt length, path).
    recent: list[OrderedDict[int, tuple[int, np.ndarray]]] = [OrderedDict() for _ in range(workers)]
    next_seq = [0] * workers
    events: list[StreamEvent] = []

    def emit(worker: int, stored: bool, blocks: np.ndarray, parent: int = -1) -> None:
        events.append(StreamEvent(worker, next_seq[worker], stored, blocks, parent))
        next_seq[worker] += 1

    concurrent = 4 * workers
    started = 0
    active: list[dict] = []
    bar = progress(conversations, "event stream")
    while active or started < conversations:
        while len(active) < concurrent and started < conversations:
            system = systems[int(rng.integers(len(systems)))]
            active.append(
                {
                    "id": started,
                    "system": len(system),
                    "path": system,
                    "turns": int(rng.integers(1, 9)),
                    "worker": int(rng.integers(workers)),
                }
            )
            started += 1
        slot = int(rng.integers(len(active)))
        conv = active[slot]
        if rng.random() < 0.1:
            conv["worker"] = int(rng.integers(workers))
        worker = conv["worker"]
        turn = table.extend(int(conv["path"][-1]), int(rng.integers(4, 49)))
        conv["path"] = path = np.concatenate([conv["path"], turn])
        cached = 0
        while cached < len(path) and int(path[cached]) in held[worker]:
            cached += 1
        emit(worker, True, path[cached:], int(path[cached - 1]) if cached else -1)
        held[worker].update(path[cached:].tolist())
        recent[worker][conv["id"]] = (conv["system"], path)
        recent[worker].move_to_end(conv["id"])
        while len(held[worker]) > capacity and len(recent[worker]) > 1:
            _, (system_len, evicted_path) = recent[worker].popitem(last=False)
            own = evicted_path[system_len:].tolist()
            evicted = np.array([b for b in own if b in held[worker]][::-1])
            if len(evicted):
                emit(worker, False, evicted)
                held[worker].difference_update(evicted.tolist())
        conv["turns"] -= 1
        if conv["turns"] == 0:
            active[slot] = active[-1]
            active.pop()
            bar.update()
    bar.close()
    sentinels = append_sentinels(table, events, next_seq)
    for worker, blocks in sentinels:
        held[worker].update(blocks.tolist())
    table.freeze()
    probes = [blocks for _, blocks in sentinels]
    for worker in range(workers):
        probes += [path for _, path in list(recent[worker].values())[-4:]]
    return EventStream(
        table=table,
        events=events,
        workers=workers,
        sentinels=sentinels,
        probes=probes,
        unique_blocks=len(set().union(*held)),
        holdings=sum(len(h) for h in held),
    )


# --------------------------------------------------------------------------- event inputs


@dataclass(frozen=True)
class Variant:
    """How an engine describes its blocks to kvrouter."""

    name: str
    # "seq": engine ids are kvrouter's own sequence hashes; "opaque": a foreign scheme.
    ids: str
    # "tokens": events carry token ids; "local": router-compatible local hashes.
    content: str
    note: str


VARIANTS = (
    Variant("kvrouter", "seq", "tokens", "default path: token ids, engine ids = our hashes"),
    Variant("kvrouter/opaque", "opaque", "tokens", "token ids, foreign engine ids (mapped)"),
    Variant(
        "kvrouter/like-for-like",
        "opaque",
        "local",
        "same input as Dynamo: precomputed local hashes + foreign engine ids",
    ),
)


def kvrouter_factories(stream: EventStream, variant: Variant) -> list[tuple[int, int, partial]]:
    """Per event, (worker, seq, a call that builds its kvrouter event from numpy arrays)."""
    table = stream.table
    ids = table.seq if variant.ids == "seq" else table.opaque
    out = []
    for e in stream.events:
        block_ids = ids[e.blocks]
        if not e.stored:
            make = partial(Removed, block_ids)
        else:
            parent = int(ids[e.parent]) if e.parent >= 0 else None
            if variant.content == "tokens":
                make = partial(Stored, block_ids, table.tokens[e.blocks].ravel(), parent=parent)
            else:
                make = partial(Stored, block_ids, local_hashes=table.local[e.blocks], parent=parent)
        out.append((e.worker, e.seq, make))
    return out


def dynamo_event(event_id: int, event: StreamEvent, table: BlockTable) -> bytes:
    """A Dynamo KvCacheEvent as JSON: external block ids are the foreign engine's."""
    ids = table.opaque[event.blocks].tolist()
    if not event.stored:
        data = f'{{"removed":{{"block_hashes":[{",".join(map(str, ids))}]}}}}'
    else:
        parent = str(int(table.opaque[event.parent])) if event.parent >= 0 else "null"
        blocks = ",".join(
            f'{{"block_hash":{b},"tokens_hash":{t}}}'
            for b, t in zip(ids, table.dynamo[event.blocks].tolist(), strict=True)
        )
        data = f'{{"stored":{{"parent_hash":{parent},"blocks":[{blocks}]}}}}'
    return f'{{"event_id":{event_id},"data":{data}}}'.encode()


def dynamo_inputs(stream: EventStream) -> list[tuple[int, bytes]]:
    return [(e.worker, dynamo_event(e.seq, e, stream.table)) for e in stream.events]


def apply_kvrouter(index: PrefixIndex, factories, bulk: bool) -> list:
    outcomes = []
    if bulk:
        for start in range(0, len(factories), BULK_CHUNK):
            chunk = factories[start : start + BULK_CHUNK]
            outcomes += index.apply_many([(w, s, [make()]) for w, s, make in chunk])
    else:
        for w, s, make in factories:
            outcomes.append(index.apply(w, s, [make()]))
    return outcomes


def dynamo_sentinels(stream: EventStream) -> list[tuple[int, list[int]]]:
    return [(w, stream.table.dynamo[blocks].tolist()) for w, blocks in stream.sentinels]


def apply_dynamo(tree, inputs: list[tuple[int, bytes]], sentinels) -> None:
    """Feeds every event, then waits until every worker's last sequence is visible."""
    for worker, payload in inputs:
        tree.apply_event(worker, payload)
    for worker, hashes in sentinels:
        while tree.find_matches(hashes).scores.get((worker, 0), 0) < len(hashes):
            time.sleep(0)


def check_outcomes(outcomes: list, what: str) -> None:
    bad = [o for o in outcomes if o.status != "applied" or o.unknown_removals]
    if bad:
        raise SystemExit(f"{what}: {len(bad)} batches not cleanly applied, e.g. {bad[0]!r}")


def kvrouter_scores(index: PrefixIndex, hashes: list[int]) -> dict[int, int]:
    return dict(index.find_matches(hashes).scores)


def dynamo_scores(tree, hashes: list[int]) -> dict[int, int]:
    return {worker: depth for (worker, _rank), depth in tree.find_matches(hashes).scores.items()}


def check_same_state(index: PrefixIndex, tree, table: BlockTable, probes, what: str) -> None:
    """Both indexes must report the same overlap for the same token blocks."""
    for path in probes:
        ours = kvrouter_scores(index, table.seq[path].tolist())
        theirs = dynamo_scores(tree, table.dynamo[path].tolist())
        if ours != theirs:
            raise SystemExit(f"{what}: indexes disagree on a probe: {ours} vs {theirs}")


# --------------------------------------------------------------------------- sections


def median_time(fn, rounds: int, round_s: float) -> float:
    """Median seconds per call over `rounds` rounds of about `round_s` each."""
    fn()
    start = time.perf_counter()
    fn()
    per_call = max(time.perf_counter() - start, 1e-7)
    calls = max(1, int(round_s / per_call))
    times = []
    with gc_paused():
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def paired_speedup(dynamo_s: list[float], ours_s: list[float]) -> float:
    """Median over repeats of each repeat's ratio: both sides of a ratio ran back to
    back, so load from other processes on the machine drifts out of it."""
    return statistics.median(d / o for d, o in zip(dynamo_s, ours_s, strict=True))


def bench_hashing(scale: Scale, rng: np.random.Generator) -> list[dict]:
    rows = []
    bar = progress(len(HASH_TOKENS), "hashing")
    for n in HASH_TOKENS:
        tokens_np = rng.integers(0, VOCAB, n, dtype=np.uint32)
        tokens = tokens_np.tolist()
        seconds = {
            "kvrouter_list": lambda t=tokens: kvrouter.hash_tokens(t, BLOCK_SIZE),
            "kvrouter_numpy": lambda a=tokens_np: kvrouter.hash_tokens(a, BLOCK_SIZE),
            "kvrouter_compact": lambda a=tokens_np: kvrouter.hash_tokens_array(a, BLOCK_SIZE),
            "dynamo_list": lambda t=tokens: dynamo.compute_block_hash_for_seq(t, BLOCK_SIZE),
        }
        row: dict = {"tokens": n}
        for name, fn in seconds.items():
            row[f"{name}_mtok_s"] = n / median_time(fn, scale.hash_rounds, scale.hash_round_s) / 1e6
        row["speedup_list"] = row["kvrouter_list_mtok_s"] / row["dynamo_list_mtok_s"]
        row["speedup_numpy"] = row["kvrouter_numpy_mtok_s"] / row["dynamo_list_mtok_s"]
        row["speedup_compact"] = row["kvrouter_compact_mtok_s"] / row["dynamo_list_mtok_s"]
        rows.append(row)
        bar.update()
    bar.close()
    return rows


def bench_events(scale: Scale, seed: int) -> dict:
    stream = conversation_stream(
        np.random.default_rng(seed),
        workers=scale.stream_workers,
        conversations=scale.stream_conversations,
        capacity=scale.stream_capacity,
    )
    table = stream.table
    sentinels = dynamo_sentinels(stream)
    factories = {v.name: kvrouter_factories(stream, v) for v in VARIANTS}
    inputs = dynamo_inputs(stream)
    runs: dict[str, list[float]] = {}
    last: dict[str, object] = {}
    cases = [(v, bulk) for v in VARIANTS for bulk in (True, False)]
    bar = progress(scale.stream_repeats * (len(cases) + 1), "event application")
    for _ in range(scale.stream_repeats):
        for variant, bulk in cases:
            key = f"{variant.name} {'apply_many' if bulk else 'apply'}"
            index = PrefixIndex(BLOCK_SIZE)
            with gc_paused():
                start = time.perf_counter()
                outcomes = apply_kvrouter(index, factories[variant.name], bulk)
                runs.setdefault(key, []).append(time.perf_counter() - start)
            check_outcomes(outcomes, key)
            last[variant.name] = index
            bar.update()
        tree = dynamo.RadixTree()
        with gc_paused():
            start = time.perf_counter()
            apply_dynamo(tree, inputs, sentinels)
            runs.setdefault("dynamo apply_event", []).append(time.perf_counter() - start)
        last["dynamo"] = tree
        bar.update()
    bar.close()
    for variant in VARIANTS:
        check_same_state(last[variant.name], last["dynamo"], table, stream.probes, variant.name)
    events, blocks = len(stream.events), stream.blocks_applied
    dynamo_runs = runs["dynamo apply_event"]
    results = []
    for key, times in runs.items():
        seconds = statistics.median(times)
        name, mode = key.split(" ")
        variant = next((v for v in VARIANTS if v.name == name), None)
        results.append(
            {
                "system": name,
                "mode": mode,
                "note": variant.note if variant else "JSON KvCacheEvent bytes, one call each",
                "seconds": seconds,
                "events_per_s": events / seconds,
                "blocks_per_s": blocks / seconds,
                "speedup": paired_speedup(dynamo_runs, times),
            }
        )
    stored = [e for e in stream.events if e.stored]
    return {
        "stream": {
            "workers": stream.workers,
            "events": events,
            "stored_events": len(stored),
            "removed_events": events - len(stored),
            "blocks": blocks,
            "mean_blocks_per_stored_event": sum(len(e.blocks) for e in stored) / len(stored),
            "repeats": scale.stream_repeats,
        },
        "results": results,
    }


@dataclass
class MatchConfig:
    workers: int
    blocks: int
    setup: dict = field(default_factory=dict)
    kvrouter: dict = field(default_factory=dict)
    # kvrouter given numpy uint64 arrays: what the list conversion costs.
    kvrouter_numpy: dict = field(default_factory=dict)
    dynamo: dict = field(default_factory=dict)


def match_setup(rng: np.random.Generator, workers: int, length: int, scale: Scale):
    """An index state and queries for `length`-block requests over `workers` workers.

    Four shared prefixes of length/4 blocks (long system prompts, shared documents);
    each worker caches one, odd workers a second. Conversations extend a prefix by
    length/4-length/2 blocks of history, cached on one worker that holds the prefix
    (a quarter on a second one too). Three queries in four continue a conversation,
    the rest start a new one on a shared prefix; the rest of each query is new blocks.
    """
    table = BlockTable(rng)
    prefix_blocks = length // 4
    prefixes = [table.extend(-1, prefix_blocks) for _ in range(4)]
    holders: list[list[int]] = [[] for _ in prefixes]
    events: list[StreamEvent] = []
    next_seq = [0] * workers
    for worker in range(workers):
        for p in {worker % 4, (worker + 1) % 4} if worker % 2 else {worker % 4}:
            events.append(StreamEvent(worker, next_seq[worker], True, prefixes[p]))
            next_seq[worker] += 1
            holders[p].append(worker)
    history_mean = 3 * length // 8
    conversations = max(16, min(2 * workers, scale.match_conversation_blocks // history_mean))
    histories = []
    for c in range(conversations):
        p = c % 4
        history = table.extend(int(prefixes[p][-1]), int(rng.integers(length // 4, length // 2)))
        histories.append((p, history))
        owners = rng.choice(holders[p], size=2 if rng.random() < 0.25 else 1, replace=False)
        for worker in owners.tolist():
            event = StreamEvent(worker, next_seq[worker], True, history, int(prefixes[p][-1]))
            events.append(event)
            next_seq[worker] += 1
    sentinels = append_sentinels(table, events, next_seq)
    table.freeze()
    queries = []
    for _ in range(scale.match_queries):
        if rng.random() < 0.75:
            p, history = histories[int(rng.integers(len(histories)))]
            path = np.concatenate([prefixes[p], history])
        else:
            path = prefixes[int(rng.integers(4))]
        fresh = rng.integers(0, 2**63, length - len(path), dtype=np.uint64).tolist()
        queries.append((table.seq[path].tolist() + fresh, table.dynamo[path].tolist() + fresh))
    return EventStream(table, events, workers, sentinels, [], 0, 0), queries


def latency_us(samples_ns: list[int]) -> dict:
    samples = np.array(samples_ns) / 1e3
    return {
        "calls": len(samples),
        "mean_us": float(samples.mean()),
        "p50_us": float(np.percentile(samples, 50)),
        "p99_us": float(np.percentile(samples, 99)),
    }


def time_queries(find, queries: list[list[int]], seconds: float, samples: list[int]) -> None:
    clock = time.perf_counter_ns
    deadline = clock() + int(seconds * 1e9)
    i = 0
    while i < len(queries) or clock() < deadline:
        query = queries[i % len(queries)]
        start = clock()
        find(query)
        samples.append(clock() - start)
        i += 1


def call_floor_us(scale: Scale) -> dict:
    """p50 of a one-block find_matches on an empty index: each API's fixed cost per
    call (for Dynamo, the hand-off to its background thread and back)."""
    floors = {}
    for name, system in (("kvrouter", PrefixIndex(BLOCK_SIZE)), ("dynamo", dynamo.RadixTree())):
        samples: list[int] = []
        with gc_paused():
            time_queries(system.find_matches, [[1]], scale.match_system_s / 8, samples)
        floors[name] = latency_us(samples)["p50_us"]
    return floors


def bench_matches(scale: Scale, seed: int) -> list[MatchConfig]:
    rng = np.random.default_rng(seed + 1)
    configs = [MatchConfig(w, n) for n in MATCH_BLOCKS for w in MATCH_WORKERS]
    bar = progress(len(configs), "find_matches")
    for config in configs:
        bar.set_postfix_str(f"{config.workers} workers x {config.blocks} blocks")
        stream, queries = match_setup(rng, config.workers, config.blocks, scale)
        factories = kvrouter_factories(stream, VARIANTS[0])
        inputs = dynamo_inputs(stream)
        sentinels = dynamo_sentinels(stream)
        ours_s, dynamo_s = [], []
        for _ in range(scale.match_setup_repeats):
            index = tree = None  # frees the previous round's before building anew
            index = PrefixIndex(BLOCK_SIZE)
            with gc_paused():
                start = time.perf_counter()
                outcomes = apply_kvrouter(index, factories, bulk=True)
                ours_s.append(time.perf_counter() - start)
            check_outcomes(outcomes, "find_matches setup")
            tree = dynamo.RadixTree()
            with gc_paused():
                start = time.perf_counter()
                apply_dynamo(tree, inputs, sentinels)
                dynamo_s.append(time.perf_counter() - start)
        config.setup = {
            "events": len(stream.events),
            "blocks": stream.blocks_applied,
            "kvrouter_apply_many_s": statistics.median(ours_s),
            "dynamo_apply_event_s": statistics.median(dynamo_s),
            "speedup": paired_speedup(dynamo_s, ours_s),
        }
        for ours_query, dynamo_query in queries[:8]:
            ours = kvrouter_scores(index, ours_query)
            theirs = dynamo_scores(tree, dynamo_query)
            if ours != theirs:
                raise SystemExit(f"find_matches disagree ({config.workers} x {config.blocks})")
        per_round = scale.match_system_s / scale.match_rounds
        ours_queries = [q for q, _ in queries]
        runs = [
            (index, ours_queries, []),
            (index, [array.array("Q", q) for q in ours_queries], []),
            (tree, [q for _, q in queries], []),
        ]
        for r in range(scale.match_rounds):
            for system, system_queries, samples in runs[:: 1 if r % 2 == 0 else -1]:
                with gc_paused():
                    time_queries(system.find_matches, system_queries, per_round, samples)
        config.kvrouter, config.kvrouter_numpy, config.dynamo = (
            latency_us(samples) for _, _, samples in runs
        )
        del index, tree, stream, queries, factories, inputs
        gc.collect()
        bar.update()
    bar.close()
    return configs


# --------------------------------------------------------------------------- memory


def trimmed_rss() -> int:
    """RSS after returning freed heap pages to the OS, so it counts live memory."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return psutil.Process().memory_info().rss


# A memory system's suffix: the index given room for every worker's capacity first, as the
# service's router gives it when they register.
RESERVED = ", reserved"


def memory_child(system: str, conversations: int, capacity: int, seed: int) -> dict:
    """Runs in a fresh process: RSS growth from applying one event stream.

    Inputs are built before the first reading, so the growth is the index alone."""
    stream = conversation_stream(
        np.random.default_rng(seed),
        workers=FULL.stream_workers,
        conversations=conversations,
        capacity=capacity,
    )
    if system == "dynamo":
        tree = dynamo.RadixTree()
        inputs = dynamo_inputs(stream)
        sentinels = dynamo_sentinels(stream)
        before = trimmed_rss()
        apply_dynamo(tree, inputs, sentinels)
    else:
        name, reserved = system.removesuffix(RESERVED), system.endswith(RESERVED)
        variant = next(v for v in VARIANTS if v.name == name)
        index = PrefixIndex(BLOCK_SIZE)
        batches = [(w, s, [make()]) for w, s, make in kvrouter_factories(stream, variant)]
        before = trimmed_rss()
        if reserved:
            index.reserve(FULL.stream_workers * capacity)
        for start in range(0, len(batches), BULK_CHUNK):
            index.apply_many(batches[start : start + BULK_CHUNK])
        stats = index.stats()
        if stats["blocks"] != stream.unique_blocks:
            raise SystemExit(f"{system}: {stats['blocks']} blocks, expected {stream.unique_blocks}")
    after = trimmed_rss()
    return {
        "system": system,
        "rss_growth_bytes": after - before,
        "unique_blocks": stream.unique_blocks,
        "holdings": stream.holdings,
        "bytes_per_block": (after - before) / stream.unique_blocks,
        "bytes_per_holding": (after - before) / stream.holdings,
    }


def bench_memory(scale: Scale, seed: int) -> list[dict]:
    variants = [v.name for v in VARIANTS[:2]]
    systems = ["dynamo", *variants, *(name + RESERVED for name in variants)]
    rows = []
    bar = progress(len(systems), "memory (subprocesses)")
    for system in systems:
        command = [
            sys.executable,
            __file__,
            "--memory-child",
            system,
            "--memory-conversations",
            str(scale.memory_conversations),
            "--memory-capacity",
            str(scale.memory_capacity),
            "--seed",
            str(seed),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"memory child {system} failed:\n{done.stderr}")
        rows.append(json.loads(done.stdout))
        bar.update()
    bar.close()
    dynamo_bytes = rows[0]["bytes_per_block"]
    for row in rows:
        row["share_of_dynamo"] = row["bytes_per_block"] / dynamo_bytes
    return rows


# --------------------------------------------------------------------------- report


def table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        return "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True))

    rule = ["-" * w for w in widths]
    return "\n".join([line(cells[0]), line(rule)] + [line(r) for r in cells[1:]])


def fmt(x: float, digits: int = 1) -> str:
    return f"{x:,.{digits}f}"


def targets(results: dict) -> dict:
    verdict = {}
    if "hashing" in results:
        worst = min(r["speedup_compact"] for r in results["hashing"])
        worst_list = min(r["speedup_list"] for r in results["hashing"])
        verdict["hashing_4x"] = {
            "met": worst >= TARGET_HASH_SPEEDUP,
            "worst_speedup_compact": worst,
            "worst_speedup_numpy_to_list": min(r["speedup_numpy"] for r in results["hashing"]),
            "worst_speedup_list": worst_list,
            "met_with_list_input": worst_list >= TARGET_HASH_SPEEDUP,
        }
    if "events" in results:
        rows = results["events"]["results"]
        default = next(r for r in rows if r["system"] == "kvrouter" and r["mode"] == "apply_many")
        sizes = results.get("find_matches", {}).get("sizes", [])
        setups = [m["setup"]["speedup"] for m in sizes]
        worst = min([default["speedup"]] + setups)
        verdict["events_3x"] = {"met": worst >= TARGET_SPEEDUP, "worst_speedup": worst}
        verdict["events_3x"]["per_mode"] = {
            f"{r['system']} {r['mode']}": r["speedup"] for r in rows if r["system"] != "dynamo"
        }
    if "find_matches" in results:
        sizes = results["find_matches"]["sizes"]
        worst = min(m["dynamo"]["p50_us"] / m["kvrouter_numpy"]["p50_us"] for m in sizes)
        worst_list = min(m["dynamo"]["p50_us"] / m["kvrouter"]["p50_us"] for m in sizes)
        verdict["find_matches_3x"] = {
            "met": worst >= TARGET_SPEEDUP,
            "worst_speedup_p50_compact_hashes": worst,
            "worst_speedup_p50_list_input": worst_list,
            "met_with_list_input": worst_list >= TARGET_SPEEDUP,
        }
    if "memory" in results:
        # Each id mode's bound holds for the index grown and sized for its workers alike.
        shares = {r["system"]: r["share_of_dynamo"] for r in results["memory"]}
        verdict["memory_30_40pct"] = {
            "met": all(
                shares[name + sized] <= bound
                for name, bound in TARGET_MEMORY_SHARES.items()
                for sized in ("", RESERVED)
            ),
            "shares": {name: share for name, share in shares.items() if name != "dynamo"},
        }
    return verdict


def report(results: dict) -> str:
    parts = []
    if "hashing" in results:
        rows = [
            [
                f"{r['tokens']:,}",
                fmt(r["kvrouter_list_mtok_s"], 0),
                fmt(r["kvrouter_numpy_mtok_s"], 0),
                fmt(r["kvrouter_compact_mtok_s"], 0),
                fmt(r["dynamo_list_mtok_s"], 0),
                fmt(r["speedup_list"], 2) + "x",
                fmt(r["speedup_numpy"], 2) + "x",
                fmt(r["speedup_compact"], 2) + "x",
            ]
            for r in results["hashing"]
        ]
        headers = [
            "tokens",
            "ours list",
            "ours numpy",
            "ours numpy->array",
            "dynamo list",
            "x (list)",
            "x (numpy)",
            "x (numpy->array)",
        ]
        parts.append("Hashing, M tokens/s\n" + table(headers, rows))
    if "events" in results:
        s = results["events"]["stream"]
        rows = [
            [
                f"{r['system']} {r['mode']}",
                fmt(r["events_per_s"] / 1e3),
                fmt(r["blocks_per_s"] / 1e6, 2),
                fmt(r["speedup"], 2) + "x",
                r["note"],
            ]
            for r in results["events"]["results"]
        ]
        parts.append(
            f"Event application: {s['events']:,} events ({s['removed_events']:,} removals), "
            f"{s['blocks']:,} blocks, {s['workers']} workers; median of {s['repeats']}\n"
            + table(["system", "k events/s", "M blocks/s", "x dynamo", "input"], rows)
        )
    if "find_matches" in results:
        rows = []
        for m in results["find_matches"]["sizes"]:
            o, d = m["kvrouter"], m["dynamo"]
            rows.append(
                [
                    m["workers"],
                    f"{m['blocks']:,}",
                    fmt(o["mean_us"]),
                    fmt(o["p50_us"]),
                    fmt(o["p99_us"]),
                    fmt(m["kvrouter_numpy"]["p50_us"]),
                    fmt(d["mean_us"]),
                    fmt(d["p50_us"]),
                    fmt(d["p99_us"]),
                    fmt(d["p50_us"] / o["p50_us"], 2) + "x",
                    fmt(d["p50_us"] / m["kvrouter_numpy"]["p50_us"], 2) + "x",
                    fmt(m["setup"]["speedup"], 2) + "x",
                ]
            )
        headers = [
            "workers", "blocks", "ours list mean", "p50", "p99", "p50 array('Q')",
            "dynamo list mean", "p50", "p99", "x p50 list", "x p50 array", "x apply",
        ]  # fmt: skip
        floor = results["find_matches"]["call_floor_p50_us"]
        parts.append(
            "find_matches latency, us; ours with a list of ints and with array('Q')"
            " (what hash_tokens_array returns), dynamo with its list of local hashes\n"
            "(x apply: event application while building the state;"
            f" per-call floor: ours {floor['kvrouter']:.1f}, dynamo {floor['dynamo']:.1f})\n"
            + table(headers, rows)
        )
    if "memory" in results:
        rows = [
            [
                r["system"],
                f"{r['unique_blocks']:,}",
                f"{r['holdings']:,}",
                fmt(r["bytes_per_block"]),
                fmt(r["bytes_per_holding"]),
                f"{r['share_of_dynamo']:.0%}",
            ]
            for r in results["memory"]
        ]
        headers = ["system", "blocks", "holdings", "B/block", "B/holding", "of dynamo"]
        parts.append("Memory from RSS, fresh process each\n" + table(headers, rows))
    if "trace" in results:
        parts.append(index_trace_bench.report(results["trace"], table, fmt))
    verdict = results.get("targets", {})
    if verdict:
        lines = [f"  {name}: {'met' if v['met'] else 'MISSED'}  {v}" for name, v in verdict.items()]
        parts.append("Targets\n" + "\n".join(lines))
    return "\n\n".join(parts)


def machine() -> dict:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line),
        platform.processor(),
    )
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "load_avg_at_start": os.getloadavg(),
        "python": platform.python_version(),
        "dynamo": getattr(dynamo, "__version__", "?"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run, under a minute")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"JSON results ({RESULTS})")
    parser.add_argument("--seed", type=int, default=0)
    sections = ("hashing", "events", "matches", "memory", "trace")
    parser.add_argument("--only", choices=sections, action="append", help="run these sections")
    parser.add_argument(
        "--trace", type=Path, default=SHARED_TRACE, help=f"a Mooncake-format trace ({SHARED_TRACE})"
    )
    parser.add_argument(
        "--trace-repeats",
        type=int,
        default=3,
        help="times the trace section applies each stream with every system (3)",
    )
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    parser.add_argument("--memory-conversations", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--memory-capacity", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        print(
            json.dumps(
                memory_child(
                    args.memory_child, args.memory_conversations, args.memory_capacity, args.seed
                )
            )
        )
        return
    scale = QUICK if args.quick else FULL
    run = set(args.only or sections)
    results: dict = {"machine": machine(), "scale": "quick" if args.quick else "full"}
    results["scale_parameters"] = asdict(scale)
    started = time.perf_counter()
    if "hashing" in run:
        results["hashing"] = bench_hashing(scale, np.random.default_rng(args.seed))
    if "events" in run:
        results["events"] = bench_events(scale, args.seed)
    if "matches" in run:
        results["find_matches"] = {
            "call_floor_p50_us": call_floor_us(scale),
            "sizes": [asdict(c) for c in bench_matches(scale, args.seed)],
        }
    if "memory" in run:
        results["memory"] = bench_memory(scale, args.seed)
    if "trace" in run:
        results["trace"] = index_trace_bench.bench_trace(
            args.trace, args.quick, args.seed, args.trace_repeats
        )
    results["targets"] = targets(results)
    results["seconds"] = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(report(results))
    print(f"\n{results['seconds']:.0f} s; results in {args.out}")


if __name__ == "__main__":
    main()
