"""A worker's PublishRequest decoded by the core (`decode_publish_request`,
what the KvEvents service uses) against the generated Python classes and
the event model's conversion (`events_from_proto`, `core_events`): the same
batch leaves the same index, and a bad one is refused with the same
message. This also checks the core's message layout against
proto/router.proto."""

from __future__ import annotations

import pytest

from kvrouter._core import DecodedBatch, PrefixIndex, PublishHello, decode_publish_request
from kvrouter.events.core import core_events
from kvrouter.events.proto import events_from_proto
from kvrouter.proto_gen import router_pb2 as pb

BS = 4
TOKENS = list(range(100, 124))
MAX_EVENTS = 100


def decoded(batch: pb.EventBatch, max_events: int = MAX_EVENTS):
    data = pb.PublishRequest(batch=batch).SerializeToString()
    return decode_publish_request(data, BS, max_events)


def through_python(index: PrefixIndex, worker: int, batch: pb.EventBatch):
    events = core_events(events_from_proto(batch.events))
    if batch.resync:
        return index.resync(worker, batch.seq, events)
    return index.apply(worker, batch.seq, events)


def rich_batches() -> list[pb.EventBatch]:
    stored = pb.StoredEvent(block_ids=[11, 12, 13], token_ids=TOKENS[:12], namespace="m")
    child = pb.StoredEvent(
        parent_block_id=13, block_ids=[14], token_ids=TOKENS[12:16], namespace="m"
    )
    host = pb.StoredEvent(block_ids=[21, 22], local_hashes=[5, 6], tier=pb.TIER_HOST)
    disk = pb.StoredEvent(block_ids=[31], token_ids=TOKENS[:4], tier=pb.TIER_DISK)
    first = pb.EventBatch(
        seq=0,
        emitted_at=12.5,
        events=[
            pb.KvEvent(stored=stored),
            pb.KvEvent(stored=child),
            pb.KvEvent(stored=host),
            pb.KvEvent(stored=disk),
            pb.KvEvent(ends_reusable=pb.EndsReusableEvent(block_ids=[14], reusable=False)),
        ],
    )
    second = pb.EventBatch(
        seq=1,
        events=[
            pb.KvEvent(removed=pb.RemovedEvent(block_ids=[12, 99])),
            pb.KvEvent(removed=pb.RemovedEvent(block_ids=[21], tier=pb.TIER_HOST)),
        ],
    )
    dump = pb.EventBatch(
        seq=2,
        resync=True,
        events=[pb.KvEvent(cleared=pb.ClearedEvent()), pb.KvEvent(stored=stored)],
    )
    return [first, second, dump]


def test_a_hello_decodes_with_its_fields():
    hello = pb.PublishHello(worker_id=2**63, next_seq=7, block_size=16)
    got = decode_publish_request(pb.PublishRequest(hello=hello).SerializeToString(), BS, 1)
    assert isinstance(got, PublishHello)
    assert (got.worker_id, got.next_seq, got.block_size) == (2**63, 7, 16)


def test_batches_leave_the_index_the_python_conversion_leaves():
    core, python = PrefixIndex(BS), PrefixIndex(BS)
    for batch in rich_batches():
        got = decoded(batch)
        assert isinstance(got, DecodedBatch)
        assert (got.seq, got.resync, got.emitted_at, len(got)) == (
            batch.seq,
            batch.resync,
            batch.emitted_at,
            len(batch.events),
        )
        stored = sum(len(e.stored.block_ids) for e in batch.events if e.HasField("stored"))
        assert got.blocks == stored
        expected = through_python(python, 1, batch)
        outcome = core.apply_decoded(1, got)
        assert (outcome.status, outcome.blocks_stored, outcome.blocks_removed) == (
            expected.status,
            expected.blocks_stored,
            expected.blocks_removed,
        )
        assert core.workers() == python.workers()
        for namespace in ("", "m"):
            tokens = TOKENS[:16]
            assert (
                core.find_matches_for_tokens(tokens, namespace=namespace).tiers
                == python.find_matches_for_tokens(tokens, namespace=namespace).tiers
            )


def test_a_gap_and_a_duplicate_are_reported_as_apply_reports_them():
    index = PrefixIndex(BS)
    first = rich_batches()[0]
    assert index.apply_decoded(1, decoded(first)).status == "applied"
    assert index.apply_decoded(1, decoded(first)).status == "duplicate"
    gap = index.apply_decoded(1, decoded(pb.EventBatch(seq=5)))
    assert (gap.status, gap.expected_seq) == ("gap", 1)


BAD_EVENTS = {
    "empty": pb.KvEvent(),
    "no blocks": pb.KvEvent(stored=pb.StoredEvent(token_ids=TOKENS[:4])),
    "no tokens": pb.KvEvent(stored=pb.StoredEvent(block_ids=[1])),
    "uneven tokens": pb.KvEvent(stored=pb.StoredEvent(block_ids=[1, 2], token_ids=TOKENS[:5])),
    "other block size": pb.KvEvent(stored=pb.StoredEvent(block_ids=[1], token_ids=TOKENS[:8])),
    "both contents": pb.KvEvent(
        stored=pb.StoredEvent(block_ids=[1], token_ids=TOKENS[:4], local_hashes=[1])
    ),
    "hash count": pb.KvEvent(stored=pb.StoredEvent(block_ids=[1, 2], local_hashes=[1])),
    "stored tier": pb.KvEvent(stored=pb.StoredEvent(block_ids=[1], token_ids=TOKENS[:4], tier=7)),
    "removed tier": pb.KvEvent(removed=pb.RemovedEvent(block_ids=[1], tier=-1)),
}


@pytest.mark.parametrize("name", BAD_EVENTS)
def test_a_bad_event_is_refused_with_the_python_paths_message(name):
    fine = pb.KvEvent(stored=pb.StoredEvent(block_ids=[1], token_ids=TOKENS[:4]))
    batch = pb.EventBatch(seq=3, events=[fine, BAD_EVENTS[name]])
    with pytest.raises(ValueError) as python:
        through_python(PrefixIndex(BS), 1, batch)
    with pytest.raises(ValueError) as core:
        decoded(batch)
    assert str(core.value) == f"batch 3: {python.value}"


def test_a_batch_over_the_event_cap_is_refused():
    events = [pb.KvEvent(removed=pb.RemovedEvent(block_ids=[i])) for i in range(MAX_EVENTS + 1)]
    refusal = f"batch 4: {MAX_EVENTS + 1} events; a batch holds at most {MAX_EVENTS}"
    with pytest.raises(ValueError, match=refusal):
        decoded(pb.EventBatch(seq=4, events=events))
    assert len(decoded(pb.EventBatch(seq=4, events=events[:MAX_EVENTS]))) == MAX_EVENTS


@pytest.mark.parametrize("data", [b"\xff", b"\x12\x05ab", pb.PublishRequest().SerializeToString()])
def test_bytes_that_are_no_request_are_refused(data):
    with pytest.raises(ValueError, match="PublishRequest"):
        decode_publish_request(data, BS, MAX_EVENTS)
