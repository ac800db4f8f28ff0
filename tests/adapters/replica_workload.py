"""A deterministic stream of worker batches for the replica tests, and a
view of an index that two equal indexes share."""

from __future__ import annotations

import random

from kvrouter import PrefixIndex, hash_tokens
from kvrouter.events import Cleared, Removed, Stored, WorkerBatch
from kvrouter.events.core import core_events

BS = 16


def workload(workers: list[int], batches: int, seed: int = 0):
    """Batches in publishing order; returns (batches, prompts). Workers store
    conversations that grow turn by turn, evict, and now and then clear."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(50_000) for _ in range(BS * rng.randint(2, 6))] for _ in range(12)]
    held: dict[int, dict[int, list[int]]] = {w: {} for w in workers}
    seqs = dict.fromkeys(workers, 0)
    out = []
    for _ in range(batches):
        worker = rng.choice(workers)
        events = []
        roll = rng.random()
        if roll < 0.6:
            which = rng.randrange(len(prompts))
            turn = prompts[which] + [rng.randrange(50_000) for _ in range(BS)]
            prompts[which] = turn
            ids = hash_tokens(turn, BS)
            have = held[worker].get(which, [])
            new = ids[len(have) :]
            events.append(
                Stored(new, turn[len(have) * BS : len(ids) * BS], parent=have[-1] if have else None)
            )
            held[worker][which] = ids
        elif roll < 0.95 and held[worker]:
            which = rng.choice(sorted(held[worker]))
            ids = held[worker].pop(which)
            events.append(Removed(ids[len(ids) // 2 :]))
            if len(ids) // 2:
                held[worker][which] = ids[: len(ids) // 2]
        else:
            events.append(Cleared())
            held[worker].clear()
        out.append(WorkerBatch(worker, seqs[worker], events))
        seqs[worker] += 1
    return out, prompts


def reference_index(batches: list[WorkerBatch]) -> PrefixIndex:
    index = PrefixIndex(BS)
    for batch in batches:
        index.apply(batch.worker_id, batch.seq, core_events(batch.events))
    return index


def view(index: PrefixIndex, prompts: list[list[int]]):
    return (
        index.workers(),
        index.stats()["blocks"],
        [index.find_matches_for_tokens(p).tiers for p in prompts],
    )
