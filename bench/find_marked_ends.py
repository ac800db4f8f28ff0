"""What marking ends (EndsReusable) costs a lookup: `find_matches` on 32
workers' prompts, in an index without a marked block and in one with one
(whose lookups then check each holding's flag), and, with `--core PATH`,
in another build's index for comparison.

    PYTHONPATH=$PWD python bench/find_marked_ends.py [--core NAME=PATH/_core.abi3.so ...]

Prints a table (µs a lookup, best of 7 rounds over 256 queries) and writes
bench/results/find_marked_ends.json.
"""

from __future__ import annotations

import argparse
import array
import importlib.util
import json
import os
import random
import time
from pathlib import Path

import kvrouter._core as this_build

BLOCK_SIZE = 16
WORKERS = 32
PROMPTS_PER_WORKER = 40
RESULTS = Path(__file__).parent / "results" / "find_marked_ends.json"


def load_core(path: str):
    spec = importlib.util.spec_from_file_location("kvrouter._core", path)
    core = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(core)
    return core


def build(core, mark: bool):
    """An index of WORKERS workers' prompts (8 shared system prompts, then
    their own text), and every fifth prompt's hashes as a query."""
    rng = random.Random(0)
    index = core.PrefixIndex(BLOCK_SIZE)
    systems = [[rng.randrange(50_000) for _ in range(BLOCK_SIZE * 64)] for _ in range(8)]
    queries = []
    for worker in range(WORKERS):
        for seq in range(PROMPTS_PER_WORKER):
            own = [rng.randrange(50_000) for _ in range(BLOCK_SIZE * rng.randrange(8, 200))]
            tokens = systems[rng.randrange(8)] + own
            hashes = core.hash_tokens(tokens, BLOCK_SIZE)
            index.apply(worker, seq, [core.Stored(hashes, tokens)])
            if seq % 5 == 0:
                queries.append(array.array("Q", hashes))
    if mark:
        # A block of a worker of its own: no query meets it.
        events = [core.Stored([1], list(range(BLOCK_SIZE))), core.EndsReusable([1], False)]
        index.apply(WORKERS, 0, events)
    return index, queries


def lookup_us(index, queries, rounds: int = 7) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for query in queries:
            index.find_matches(query)
        best = min(best, (time.perf_counter() - start) / len(queries))
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--core", action="append", default=[], help="NAME=PATH of another build")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    legs = [("this build", this_build, False), ("this build, one end marked", this_build, True)]
    for spec in args.core:
        name, _, path = spec.partition("=")
        legs.append((name, load_core(path), False))
    load = os.getloadavg()
    rows = []
    for name, core, mark in legs:
        index, queries = build(core, mark)
        rows.append({"build": name, "queries": len(queries), "us": lookup_us(index, queries)})
    base = rows[0]["us"]
    print(f"{'build':<32} {'µs a lookup':>12} {'× this build':>13}")
    for row in rows:
        print(f"{row['build']:<32} {row['us']:>12.2f} {row['us'] / base:>13.2f}")
    report = {"load_before": load, "load_after": os.getloadavg(), "rows": rows}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
