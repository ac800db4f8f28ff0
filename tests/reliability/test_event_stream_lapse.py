"""A worker whose event publisher is down while its heartbeats go on: its
cache changes unseen, so past `event_stream_ttl_s` the router stops routing
to it, and routes to it again once a stream is back level or resynced. A
worker that said it publishes is held to that even when the router has none
of its entries, as after a restart without a snapshot."""

from __future__ import annotations

from serve_process import ServeProcess
from waiting import wait_until

from kvrouter.client import KvEventPublisher, RouterClient, WorkerRegistration
from kvrouter.demo.cluster import free_port
from kvrouter.proto_gen import router_pb2 as pb

from .publish_stream import Stream
from .worker_process import BLOCK, prompt

BLOCKS = 8


def test_a_worker_without_its_event_stream_stops_being_routable(start_router):
    router = start_router()
    registration = WorkerRegistration(
        router.target, role="both", capacity_blocks=10_000, worker_id=1
    )
    registration.start_background()
    block_ids, tokens = list(range(BLOCKS)), prompt(1, BLOCKS)

    def dump_cache(sink) -> None:
        sink.stored(None, block_ids, tokens)

    def worker() -> tuple[bool, int, int]:
        (info,) = router.client.list_workers()
        return info.routable, info.index_blocks, info.next_event_seq

    try:
        publisher = KvEventPublisher(router.target, 1, dump_cache=dump_cache).start()
        publisher.stored(None, block_ids, tokens)
        assert publisher.flush(10)
        assert worker()[:2] == (True, BLOCKS)
        publisher.close(timeout=1)  # the publisher is gone; heartbeats go on

        wait_until(lambda: not worker()[0], what="the streamless worker to leave routing")
        _, blocks, next_seq = worker()
        assert blocks == BLOCKS  # its entries stay, unserved, for its return

        # A stream back level with the index: nothing happened while away.
        level = Stream(
            router.target, pb.PublishHello(worker_id=1, next_seq=next_seq, block_size=BLOCK)
        )
        assert level.replies.get(timeout=10).WhichOneof("kind") == "ack"
        wait_until(lambda: worker()[0], what="the level stream to make it routable")
        level.close()
        wait_until(lambda: not worker()[0], what="the worker to leave routing again")

        # A new publisher: its first batch is a resync of what it holds.
        returned = KvEventPublisher(router.target, 1, dump_cache=dump_cache)
        returned.stored(None, block_ids, tokens)
        returned.start()
        try:
            wait_until(lambda: worker()[:2] == (True, BLOCKS), what="the resync")
        finally:
            returned.close(timeout=1)
    finally:
        registration.stop_background(deregister=False)


def test_a_publishing_worker_whose_stream_is_down_is_not_routed_to_by_a_restarted_router():
    target = f"127.0.0.1:{free_port()}"
    router = ServeProcess(listen=target)
    registration = WorkerRegistration(
        target, role="both", capacity_blocks=10_000, worker_id=1, publishes_events=True
    )
    registration.start_background()
    block_ids, tokens = list(range(BLOCKS)), prompt(1, BLOCKS)

    def dump_cache(sink) -> None:
        sink.stored(None, block_ids, tokens)

    def worker() -> tuple[bool, int] | None:
        with RouterClient(target, timeout=2) as client:
            try:
                infos = client.list_workers()
            except Exception:
                return None
        return (infos[0].routable, infos[0].index_blocks) if infos else None

    try:
        publisher = KvEventPublisher(target, 1, dump_cache=dump_cache).start()
        publisher.stored(None, block_ids, tokens)
        assert publisher.flush(10)
        assert worker() == (True, BLOCKS)
        publisher.close(timeout=1)  # its cache is still there; its stream is not
        router.kill()
        router = ServeProcess(listen=target)  # no snapshot: an empty index

        wait_until(lambda: worker() is not None, what="the worker to register again")
        wait_until(lambda: worker() == (False, 0), what="the streamless worker to stay unrouted")

        # A new publisher: its first batch is a resync of what it holds.
        returned = KvEventPublisher(target, 1, dump_cache=dump_cache)
        returned.stored(None, block_ids, tokens)
        returned.start()
        try:
            wait_until(lambda: worker() == (True, BLOCKS), what="the resync")
        finally:
            returned.close(timeout=1)
    finally:
        registration.stop_background(deregister=False)
        router.kill()
