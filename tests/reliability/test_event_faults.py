"""Event batches lost, duplicated and reordered on their way to the router:
the gap is detected, and a resync leaves exactly the index that in-order
delivery builds (checked against a reference index fed in order)."""

from __future__ import annotations

import random

import pytest
from waiting import wait_until

from kvrouter._core import PrefixIndex
from kvrouter.client import WorkerRegistration
from kvrouter.events.core import core_events
from kvrouter.events.proto import events_from_proto
from kvrouter.proto_gen import router_pb2 as pb

from .publish_stream import Stream

BLOCK = 16
BATCHES = 40


def workload(rng: random.Random) -> tuple[list[pb.EventBatch], list[list[int]]]:
    """Batches of stored chains and removals, and every prompt stored."""
    batches, prompts, live, next_id = [], [], [], 1
    for seq in range(BATCHES):
        batch = pb.EventBatch(seq=seq)
        blocks = rng.randint(1, 4)
        tokens = [rng.randrange(2**32) for _ in range(blocks * BLOCK)]
        ids = list(range(next_id, next_id + blocks))
        next_id += blocks
        batch.events.add(stored=pb.StoredEvent(block_ids=ids, token_ids=tokens))
        prompts.append(tokens)
        live.extend(ids)
        if live and rng.random() < 0.4:
            gone = rng.sample(live, rng.randint(1, min(3, len(live))))
            live = [i for i in live if i not in gone]
            batch.events.add(removed=pb.RemovedEvent(block_ids=gone))
        batches.append(batch)
    return batches, prompts


def perturbed(batches: list[pb.EventBatch], rng: random.Random) -> list[pb.EventBatch]:
    """Each batch lost, duplicated or swapped with the next, 20% each."""
    out: list[pb.EventBatch] = []
    held = None
    for batch in batches:
        roll = rng.random()
        if roll < 0.2:
            continue
        out.append(batch)
        if roll < 0.4:
            out.append(batch)
        if held is not None:
            out.append(held)
            held = None
        if 0.4 <= roll < 0.6:
            held = out.pop()
    return out + ([held] if held is not None else [])


def reference_index(batches: list[pb.EventBatch]) -> PrefixIndex:
    index = PrefixIndex(BLOCK)
    for batch in batches:
        index.apply(1, batch.seq, core_events(events_from_proto(batch.events)))
    return index


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_lost_duplicated_and_reordered_batches_end_in_the_exact_index(start_router, seed):
    router = start_router()
    registration = WorkerRegistration(
        router.target, role="both", capacity_blocks=10_000, worker_id=1
    )
    registration.start_background()
    rng = random.Random(seed)
    batches, prompts = workload(rng)
    try:
        first = Stream(router.target, pb.PublishHello(worker_id=1, next_seq=0, block_size=BLOCK))
        for batch in perturbed(batches, rng):
            first.send(batch)
        first.close()  # the worker reconnects, as a publisher does after any stream error

        second = Stream(
            router.target, pb.PublishHello(worker_id=1, next_seq=BATCHES, block_size=BLOCK)
        )
        reply = second.replies.get(timeout=10)
        if reply.WhichOneof("kind") == "resync":
            for batch in batches[reply.resync.expected_seq :]:
                second.send(batch)
        wait_until(
            lambda: router.on_loop(router.server.index.workers).get(1, (0, 0))[1] == BATCHES,
            what="the router to reach the last batch",
        )
        wait_until(lambda: router.client.list_workers()[0].routable, what="the stale mark to clear")
        second.close()
    finally:
        registration.stop_background(deregister=False)

    expected = reference_index(batches)
    index = router.server.index
    assert router.on_loop(index.stats)["blocks"] == expected.stats()["blocks"]
    assert router.on_loop(index.workers) == expected.workers()
    for tokens in prompts:
        got = router.on_loop(index.find_matches_for_tokens, tokens)
        want = expected.find_matches_for_tokens(tokens)
        assert (got.scores, got.tiers) == (want.scores, want.tiers)
