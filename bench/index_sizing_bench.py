"""What sizing the index's tables costs the router while it serves: the stalls of issue 18.

A router sizes its index for its registered workers' capacity (`Router.upsert_worker`),
and an engine's first ids of its own make the name table. Both write tables of up to
128 MiB. Three cases, at the trace bench's 10M fleet (32 workers of 327,680 blocks):

- `register`: the fleet registers with an empty index;
- `join`: one worker of 2^24 blocks joins a fleet whose index holds `--blocks` blocks
  (the tables are remade with every entry);
- `first ids`: the first batches of an engine naming blocks by ids of its own, into an
  index reserved for the fleet;
- `first ids, one batch`: `--blocks` such blocks in one `apply` call (a library caller's
  path; the service applies a big batch a slice at a time).

Meanwhile one thread looks a prompt up again and again, and in `join` another applies
small batches; each call is timed. The table gives how long the registering caller was
held, and the longest lookup and batch while the tables were remade against the p99 of
the same calls before it (the ceiling: no sizing at all). Each `--core NAME=PATH` build
runs in turn, `--repeats` times.

    .venv/bin/python bench/index_sizing_bench.py \\
        --core before=/tmp/before/_core.abi3.so --core now=kvrouter/_core.abi3.so
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import threading
import time
from pathlib import Path

import numpy as np
from index_growth_bench import load_core

RESULTS = Path(__file__).resolve().parent / "results" / "index_sizing.json"
BLOCK_SIZE = 16
FLEET = (32, 327_680)
JOIN_CAPACITY = 1 << 24
CHAIN = 1_024
BASELINE_S = 0.3
# A prompt's hashes; what it finds does not matter, only how long it waits.
QUERY = np.arange(1, 65, dtype=np.uint64)


class Timed(threading.Thread):
    """Calls `call` until stopped, keeping (start, seconds) of each call."""

    def __init__(self, call) -> None:
        super().__init__(daemon=True)
        self.call, self.calls, self.stopped = call, [], threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            start = time.perf_counter()
            self.call()
            self.calls.append((start, time.perf_counter() - start))

    def stop(self) -> None:
        self.stopped.set()
        self.join()

    def before(self, at: float) -> list[float]:
        return [s for t, s in self.calls if t + s < at]

    def during(self, start: float, end: float) -> list[float]:
        return [s for t, s in self.calls if t < end and t + s > start]


def chains(core, count: int, seed: int, opaque: bool):
    """`count` events of CHAIN blocks from the root, engine ids the router's hashes or
    opaque ones."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        local = rng.integers(1, 1 << 63, CHAIN, dtype=np.uint64)
        ids = (
            rng.integers(1, 1 << 63, CHAIN, dtype=np.uint64)
            if opaque
            else np.array(core.chain_hashes(local), dtype=np.uint64)
        )
        yield core.Stored(ids, local_hashes=local)


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 2)


def p99(samples: list[float]) -> float:
    return float(np.percentile(samples, 99)) if samples else 0.0


def wait_sized(index) -> None:
    """The current build sizes in the background; an older one had sized by now."""
    getattr(index, "wait_sized", lambda: None)()


def watched(index, remake, applier=None) -> dict:
    """Runs `remake()` with a lookup thread (and `applier`) going; the calls before
    it are the baseline."""
    finder = Timed(lambda: index.find_matches(QUERY))
    threads = [finder] + ([applier] if applier else [])
    for thread in threads:
        thread.start()
    time.sleep(BASELINE_S)
    start = time.perf_counter()
    held = remake()
    wait_sized(index)
    end = time.perf_counter()
    time.sleep(0.05)
    for thread in threads:
        thread.stop()
    row = {
        "caller_ms": ms(held),
        "sized_ms": ms(end - start),
        "find_p99_before_ms": ms(p99(finder.before(start))),
        "find_max_during_ms": ms(max(finder.during(start, end), default=0.0)),
    }
    if applier:
        row["apply_p99_before_ms"] = ms(p99(applier.before(start)))
        row["apply_max_during_ms"] = ms(max(applier.during(start, end), default=0.0))
    return row


def register(core) -> dict:
    index = core.PrefixIndex(BLOCK_SIZE)
    router = core.Router(index)

    def remake() -> float:
        held = 0.0
        for worker in range(FLEET[0]):
            start = time.perf_counter()
            router.upsert_worker(worker, "both", FLEET[1])
            held = max(held, time.perf_counter() - start)
        return held

    return watched(index, remake) | {"table_mib": index.stats()["table_bytes"] >> 20}


def join(core, blocks: int, seed: int) -> dict:
    index = core.PrefixIndex(BLOCK_SIZE)
    for number, event in enumerate(chains(core, blocks // CHAIN, seed, opaque=False)):
        index.apply(number % FLEET[0], number // FLEET[0], [event])
    sized = core.Router(index)
    # Made ahead, so that the applying thread holds the GIL as little as the lookups'.
    extra = itertools.cycle(list(chains(core, 64, seed + 1, opaque=False)))
    seq = itertools.count()
    applier = Timed(lambda: index.apply(10_000, next(seq), [next(extra)]))

    def remake() -> float:
        start = time.perf_counter()
        sized.upsert_worker(20_000, "both", JOIN_CAPACITY)
        return time.perf_counter() - start

    return watched(index, remake, applier) | {"index_blocks": index.stats()["blocks"]}


def first_ids(core, seed: int) -> dict:
    index = core.PrefixIndex(BLOCK_SIZE)
    index.reserve(FLEET[0] * FLEET[1])
    events = list(chains(core, 41, seed, opaque=True))
    times = []
    for seq, event in enumerate(events):
        start = time.perf_counter()
        index.apply(0, seq, [event])
        times.append(time.perf_counter() - start)
    wait_sized(index)
    return {
        "first_batch_ms": ms(times[0]),
        "median_batch_ms": ms(statistics.median(times[1:])),
        "max_later_batch_ms": ms(max(times[1:])),
        "table_mib": index.stats()["table_bytes"] >> 20,
    }


def first_ids_in_one_batch(core, blocks: int, seed: int) -> dict:
    index = core.PrefixIndex(BLOCK_SIZE)
    index.reserve(FLEET[0] * FLEET[1])
    events = list(chains(core, blocks // CHAIN, seed, opaque=True))
    start = time.perf_counter()
    index.apply(0, 0, events)
    applied = time.perf_counter() - start
    wait_sized(index)
    return {
        "apply_ms": ms(applied),
        "sized_ms": ms(time.perf_counter() - start),
        "table_mib": index.stats()["table_bytes"] >> 20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--core", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--blocks", type=int, default=4_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    cores = [c.split("=", 1) for c in args.core] or [["now", "kvrouter/_core.abi3.so"]]
    modules = {name: load_core(name, Path(path)) for name, path in cores}
    runs = []
    for repeat in range(args.repeats):
        for name, core in modules.items():
            row = {
                "core": name,
                "repeat": repeat,
                "register": register(core),
                "join": join(core, args.blocks, args.seed + repeat),
                "first_ids": first_ids(core, args.seed + repeat),
                "first_ids_one_batch": first_ids_in_one_batch(
                    core, args.blocks, args.seed + repeat
                ),
            }
            runs.append(row)
            print(json.dumps(row), flush=True)
    results = {"load": os.getloadavg(), "blocks": args.blocks, "runs": runs}
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(report(runs))


def report(runs: list[dict]) -> str:
    """One line per build: the median over repeats of each figure, in ms."""
    columns = (
        ("register", "caller_ms", "register: caller held"),
        ("register", "find_max_during_ms", "longest find"),
        ("register", "find_p99_before_ms", "find p99 before"),
        ("join", "caller_ms", "join: caller held"),
        ("join", "find_max_during_ms", "longest find"),
        ("join", "find_p99_before_ms", "find p99 before"),
        ("join", "apply_max_during_ms", "longest batch"),
        ("join", "apply_p99_before_ms", "batch p99 before"),
        ("first_ids", "first_batch_ms", "first ids: first batch"),
        ("first_ids", "median_batch_ms", "median batch"),
        ("first_ids_one_batch", "apply_ms", "one batch of them"),
    )
    lines = ["| build | " + " | ".join(c[2] for c in columns) + " |"]
    lines.append("|---|" + "---:|" * len(columns))
    for name in dict.fromkeys(r["core"] for r in runs):
        mine = [r for r in runs if r["core"] == name]
        cells = [f"{statistics.median(r[case][key] for r in mine):.1f}" for case, key, _ in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
