"""A worker process for the crash tests: registers, publishes a cache of
`blocks` blocks (and dumps it on request), prints "ready", then waits to be
killed.

    python worker_process.py TARGET WORKER_ID SEED BLOCKS
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
    block_ids = [seed * 1_000 + i for i in range(blocks)]
    tokens = prompt(seed, blocks)

    def dump_cache(sink) -> None:
        if blocks:
            sink.stored(None, block_ids, tokens)

    WorkerRegistration(
        target, role="both", capacity_blocks=10_000, worker_id=worker_id, address=f"w{worker_id}:1"
    ).start_background()
    publisher = KvEventPublisher(target, worker_id, dump_cache=dump_cache, backoff_max_s=0.2)
    publisher.start()
    if blocks:
        publisher.stored(None, block_ids, tokens)
    if not publisher.flush(timeout=20):
        sys.exit("events not acknowledged")
    print("ready", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
