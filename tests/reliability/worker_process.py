"""A worker process for the crash tests: registers, publishes a cache of
`blocks` blocks (and dumps it on request), prints "ready", then waits to be
killed. With `churn`, it keeps caching and evicting one more block, so that
events are in flight whenever the router fails.

    python worker_process.py TARGET WORKER_ID SEED BLOCKS [churn]
"""

from __future__ import annotations

import sys
import time

from kvrouter.client import KvEventPublisher, WorkerRegistration

BLOCK = 16


def prompt(seed: int, blocks: int) -> list[int]:
    return [seed * 1_000_003 + i for i in range(blocks * BLOCK)]


def main() -> None:
    target, worker_id, seed, blocks = sys.argv[1], *map(int, sys.argv[2:5])
    churn = sys.argv[5:] == ["churn"]
    block_ids = [seed * 1_000 + i for i in range(blocks)]
    tokens = prompt(seed, blocks)

    def dump_cache(sink) -> None:
        if blocks:
            sink.stored(None, block_ids, tokens)

    WorkerRegistration(
        target,
        role="both",
        capacity_blocks=10_000,
        worker_id=worker_id,
        address=f"w{worker_id}:1",
        publishes_events=True,
    ).start_background()
    publisher = KvEventPublisher(target, worker_id, dump_cache=dump_cache, backoff_max_s=0.2)
    publisher.start()
    if blocks:
        publisher.stored(None, block_ids, tokens)
    if not publisher.flush(timeout=20):
        sys.exit("events not acknowledged")
    print("ready", flush=True)
    # Held in no dump: each eviction follows its store at once.
    passing_id, passing_tokens = seed * 1_000 + blocks, prompt(seed + 500, 1)
    while True:
        if not churn:
            time.sleep(60)
            continue
        publisher.stored(None, [passing_id], passing_tokens)
        publisher.removed([passing_id])
        time.sleep(0.01)


if __name__ == "__main__":
    main()
