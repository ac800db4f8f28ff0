"""Event batches as big as the caps allow: a 40,000-event batch is applied
(off the event loop, a slice of the index at a time) while the router goes
on routing, and a batch over `max_batch_events` is refused with
INVALID_ARGUMENT without touching the index."""

from __future__ import annotations

import grpc
import pytest

from kvrouter.client import WorkerRegistration
from kvrouter.proto_gen import router_pb2 as pb

from .publish_stream import Stream
from .worker_process import prompt

EVENTS = 40_000


@pytest.fixture
def router(start_router):
    router = start_router(max_batch_events=EVENTS)
    registration = WorkerRegistration(
        router.target, role="both", capacity_blocks=100_000, worker_id=1
    )
    registration.start_background()
    yield router
    registration.stop_background(deregister=False)


def one_block_events(count: int) -> list[pb.KvEvent]:
    return [
        pb.KvEvent(stored=pb.StoredEvent(block_ids=[i + 1], token_ids=range(16 * i, 16 * i + 16)))
        for i in range(count)
    ]


def reply(stream: Stream) -> pb.PublishReply:
    return stream.replies.get(timeout=60)


def test_a_batch_at_the_event_cap_is_applied_while_routing_goes_on(router):
    stream = Stream(router.target, pb.PublishHello(worker_id=1, next_seq=0, block_size=16))
    try:
        assert reply(stream).ack.next_seq == 0
        stream.send(pb.EventBatch(seq=0, events=one_block_events(EVENTS)))
        while stream.replies.empty():
            assert router.client.route(prompt(7, 2)).decode_worker == 1
        assert reply(stream).ack.next_seq == 1
        assert router.index_blocks() == {1: EVENTS}
    finally:
        stream.close()


def test_a_batch_over_the_event_cap_is_refused(router):
    stream = Stream(router.target, pb.PublishHello(worker_id=1, next_seq=0, block_size=16))
    try:
        assert reply(stream).ack.next_seq == 0
        stream.send(pb.EventBatch(seq=0, events=one_block_events(EVENTS + 1)))
        assert stream.ended.wait(60)
        assert stream.replies.empty()
        assert stream.error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"at most {EVENTS}" in stream.error.details()
        assert router.index_blocks() == {}
    finally:
        stream.close()
