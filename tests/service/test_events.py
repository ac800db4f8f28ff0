"""KV event streams: acknowledgements, gaps answered with a resync request,
and the publisher's replay and full-dump answers."""

from __future__ import annotations

import asyncio
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from fuzz.service_state import WORKER, ServiceState, publish_request
from waiting import wait_until

from kvrouter.client import KvEventPublisher
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc
from kvrouter.service.errors import ServiceError

from .helpers import BLOCK, prompt


class RawStream:
    """A Publish stream driven message by message, as a misbehaving worker would."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self._out: queue.Queue = queue.Queue()
        self.replies = iter(
            router_pb2_grpc.KvEventsStub(self.channel).Publish(iter(self._out.get, None))
        )

    def send(self, **kind) -> None:
        self._out.put(pb.PublishRequest(**kind))

    def batch(self, seq: int, *events, resync: bool = False) -> None:
        self.send(batch=pb.EventBatch(seq=seq, events=events, resync=resync))

    def reply(self) -> pb.PublishReply:
        return next(self.replies)

    def close(self) -> None:
        self._out.put(None)
        self.channel.close()


@pytest.fixture
def raw(router):
    streams = []

    def open_stream(worker_id: int, next_seq: int = 0, block_size: int = BLOCK) -> RawStream:
        stream = RawStream(router.target)
        streams.append(stream)
        stream.send(
            hello=pb.PublishHello(worker_id=worker_id, next_seq=next_seq, block_size=block_size)
        )
        return stream

    yield open_stream
    for stream in streams:
        stream.close()


def stored(block_ids, tokens, parent=None) -> pb.KvEvent:
    event = pb.StoredEvent(block_ids=block_ids, token_ids=tokens)
    if parent is not None:
        event.parent_block_id = parent
    return pb.KvEvent(stored=event)


def routable(router, worker_id: int) -> bool:
    return {w.worker_id: w.routable for w in router.client().list_workers()}[worker_id]


def test_batches_are_acknowledged_in_order(router, raw):
    router.worker(1)
    stream = raw(1)
    assert stream.reply().ack.next_seq == 0
    stream.batch(0, stored([10], prompt(1, 1)))
    assert stream.reply().ack.next_seq == 1
    stream.batch(0, stored([10], prompt(1, 1)))  # a duplicate changes nothing
    assert stream.reply().ack.next_seq == 1


def test_a_gap_triggers_a_resync_and_a_replay_heals_it(router, raw):
    router.worker(1)
    router.worker(2)
    tokens = prompt(seed=3, blocks=2)
    stream = raw(1)
    stream.reply()
    stream.batch(0, stored([10], tokens[:BLOCK]))
    assert stream.reply().ack.next_seq == 1

    stream.batch(2, stored([12], prompt(seed=4, blocks=1)))  # batch 1 went missing
    request = stream.reply().resync
    assert request.expected_seq == 1 and "gap" in request.reason
    assert not routable(router, 1)  # its index entries are not trusted meanwhile
    stream.batch(3, stored([13], prompt(seed=5, blocks=1)))  # dropped while awaiting 1

    stream.batch(1, stored([11], tokens[BLOCK:], parent=10))
    assert stream.reply().ack.next_seq == 2
    assert routable(router, 1)
    assert router.client().route(tokens).decode_worker == 1


def test_a_resync_dump_replaces_the_workers_entries(router, raw):
    router.worker(1)
    router.worker(2)
    stream = raw(1)
    stream.reply()
    stream.batch(0, stored([10], prompt(seed=1, blocks=1)))
    stream.reply()
    stream.batch(5, stored([20], prompt(seed=2, blocks=1)), resync=True)
    assert stream.reply().ack.next_seq == 6
    client = router.client()
    assert client.route(prompt(seed=2, blocks=1)).decode_worker == 1
    scores = router.on_loop(router.server.index.find_matches_for_tokens, prompt(seed=1, blocks=1))
    assert scores.scores == {}


def test_malformed_or_unregistered_streams_are_refused(router, raw):
    router.worker(1)
    stream = raw(1)
    stream.reply()
    stream.batch(0, stored([10], list(range(BLOCK + 3))))  # not whole blocks
    with pytest.raises(grpc.RpcError) as e:
        stream.reply()
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "block_size" in e.value.details() and "16" in e.value.details()
    assert router.client().list_workers()[0].next_event_seq == 0  # nothing applied

    for bad in (raw(7), raw(1, block_size=32)):
        with pytest.raises(grpc.RpcError) as e:
            bad.reply()
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_publisher_buffers_across_a_router_restart_with_snapshot(start_router, tmp_path):
    fast = dict(heartbeat_interval_s=0.1, heartbeat_ttl_s=2.0, snapshot_path=str(tmp_path / "ix"))
    first = start_router(**fast)
    first.worker(1)
    first.worker(2)
    publisher = first.publisher(1)
    tokens = prompt(seed=8, blocks=4)
    publisher.stored(None, [1, 2], tokens[: 2 * BLOCK])
    assert publisher.flush(10)
    first.call(first.server.stop(grace=0))

    publisher.stored(2, [3, 4], tokens[2 * BLOCK :])  # while no router listens
    second = start_router(listen=first.target, **fast)
    wait_until(lambda: len(second.client().list_workers()) == 2, what="re-registration")
    assert publisher.flush(10)
    assert publisher.dumps_sent == 0  # the snapshot kept the stream; a replay sufficed
    result = second.client().route(tokens, explain=True)
    assert result.decode_worker == 1
    assert {c.worker_id: c.overlap for c in result.explanation.decode_candidates}[1] == 4


def test_publisher_dumps_its_cache_for_a_router_that_lost_it(start_router, tmp_path):
    first = start_router()
    cache: dict[int, tuple[int | None, list[int]]] = {}
    lock = threading.Lock()

    def dump_cache(sink) -> None:
        with lock:
            for block_id, (parent, tokens) in cache.items():
                sink.stored(parent, [block_id], tokens)

    tokens = prompt(seed=11, blocks=3)
    first.worker(1)
    publisher = first.publisher(1, dump_cache=dump_cache)
    for i in range(3):
        with lock:
            cache[100 + i] = (99 + i if i else None, tokens[i * BLOCK : (i + 1) * BLOCK])
        publisher.stored(99 + i if i else None, [100 + i], tokens[i * BLOCK : (i + 1) * BLOCK])
    assert publisher.flush(10)

    # A new router on another port knows nothing; the worker moves to it.
    second = start_router()
    second.worker(1)
    second.worker(2)
    publisher.target = second.target
    first.call(first.server.stop(grace=0))
    wait_until(lambda: publisher.dumps_sent >= 1, what="the dump")
    wait_until(lambda: second.client().list_workers()[0].index_blocks == 3, what="the dump")
    assert second.client().route(tokens).decode_worker == 1


def test_a_closed_publisher_starts_again_where_it_left_off(router):
    router.worker(1)
    tokens = prompt(seed=12, blocks=2)
    publisher = KvEventPublisher(router.target, 1, backoff_max_s=0.2)
    for i in range(2):
        publisher.start()
        publisher.stored(10 + i - 1 if i else None, [10 + i], tokens[i * BLOCK : (i + 1) * BLOCK])
        assert publisher.flush(10)
        publisher.close()
    assert router.client().list_workers()[0].index_blocks == 2
    assert router.client().route(tokens).decode_worker == 1


def test_a_big_batch_during_shutdown_is_unavailable():
    state = ServiceState()
    state.events.close_all("the router is shutting down")
    # Over the size applied on the event loop: it would go to the events thread.
    events = [pb.KvEvent(removed=pb.RemovedEvent(block_ids=[i])) for i in range(20_000)]
    with pytest.raises(ServiceError) as refused:
        state.ingest(pb.EventBatch(seq=0, events=events))
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE


class GatedThread(ThreadPoolExecutor):
    """The events thread, running each call it is given only once the test
    opens the gate for it."""

    def __init__(self) -> None:
        super().__init__(1)
        self.gate = threading.Semaphore(0)
        self.calls = 0

    def submit(self, fn, /, *args, **kwargs):
        self.calls += 1

        def gated():
            self.gate.acquire()
            return fn(*args, **kwargs)

        return super().submit(gated)


BIG = pb.EventBatch(
    seq=0,
    events=[
        pb.KvEvent(stored=pb.StoredEvent(block_ids=[i + 1], token_ids=range(4 * i, 4 * i + 4)))
        for i in range(8_000)
    ],
)
SMALL = pb.EventBatch(seq=1, events=[pb.KvEvent(removed=pb.RemovedEvent(block_ids=[1]))])


@pytest.mark.parametrize("old_stream_ends", [False, True], ids=["open", "ended"])
def test_a_new_streams_batch_waits_for_the_batch_on_the_events_thread(old_stream_ends):
    """A reconnected worker's small batch, applied on the event loop, does not
    cut in before (or into) its big batch from the old stream, still on the
    events thread, also once the old stream's reader is cancelled (as a
    stream replaced by a newer one is): the worker's batches are applied in
    the order they came."""
    state = ServiceState()
    state.events._thread.shutdown()
    thread = state.events._thread = GatedThread()

    async def both():
        first = asyncio.create_task(state.events.ingest(WORKER, publish_request(BIG)))
        thread.gate.release()  # its decoding
        while thread.calls < 2:  # until its apply waits at the gate
            await asyncio.sleep(0.001)
        if old_stream_ends:
            first.cancel()
            await asyncio.sleep(0)
        second = asyncio.create_task(state.events.ingest(WORKER, publish_request(SMALL)))
        await asyncio.sleep(0)
        thread.gate.release()
        return await asyncio.gather(first, second, return_exceptions=True)

    first, second = asyncio.run(both())
    thread.shutdown()
    if old_stream_ends:
        assert isinstance(first, asyncio.CancelledError)
    else:
        assert first.ack.next_seq == 1
    assert second.ack.next_seq == 2
    assert state.index.workers()[WORKER][0] == 7_999
