"""A worker whose transport stops taking the router's replies while it goes
on publishing: the router applies its batches, keeps one pending ack for it
however many batches come (acks are cumulative), and closes the stream once
a reply has waited `event_ack_timeout_s`: it reads the stream no more, and
the worker, streamless, leaves routing."""

from __future__ import annotations

import pytest
from waiting import wait_until

from kvrouter.client import WorkerRegistration
from kvrouter.proto_gen import router_pb2 as pb

from .unread_publish import UnreadPublish
from .worker_process import prompt

BATCHES = 3000


@pytest.fixture
def unread_stream():
    """A registered worker 1 and its Publish stream, whose replies go unread."""
    streams = []

    def open_stream(router) -> UnreadPublish:
        registration = WorkerRegistration(
            router.target, role="both", capacity_blocks=100, worker_id=1
        )
        registration.start_background()
        hello = pb.PublishHello(worker_id=1, next_seq=0, block_size=16)
        stream = UnreadPublish(int(router.target.rsplit(":", 1)[1]), hello)
        streams.append((stream, registration))
        stored = pb.KvEvent(stored=pb.StoredEvent(block_ids=[1], token_ids=prompt(1, 1)))
        stream.send(pb.PublishRequest(batch=pb.EventBatch(seq=0, events=[stored])))
        return stream

    yield open_stream
    for stream, registration in streams:
        stream.close()
        registration.stop_background(deregister=False)


def test_unread_acks_cost_one_pending_reply(start_router, unread_stream):
    router = start_router(event_ack_timeout_s=600.0)
    stream = unread_stream(router)
    for seq in range(1, BATCHES):
        stream.send(pb.PublishRequest(batch=pb.EventBatch(seq=seq)))

    def applied() -> int:
        (info,) = router.client.list_workers()
        return info.next_event_seq

    wait_until(lambda: applied() == BATCHES, what="every batch to be applied")
    assert router.on_loop(router.server.events.pending_replies) == 1
    assert router.index_blocks() == {1: 1}


def test_a_stream_whose_replies_go_unread_is_closed(start_router, unread_stream):
    router = start_router(event_ack_timeout_s=1.0, event_stream_ttl_s=1.0)
    unread_stream(router)
    closed = router.server.metrics.event_streams_closed.labels(reason="unread")
    wait_until(lambda: closed._value.get() == 1, what="the router to close the unread stream")
    # No longer read, its batches unseen: the worker leaves routing.
    wait_until(lambda: not router.client.list_workers()[0].routable, what="the worker to be stale")
