"""Oversized messages and huge token lists are refused by the configured
limits, over gRPC, and the router keeps serving."""

from __future__ import annotations

import grpc
import pytest

from kvrouter.client import KvEventPublisher, WorkerRegistration
from kvrouter.client.types import RouterError
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

from .worker_process import prompt


@pytest.fixture
def router(start_router):
    # max_prompt_tokens 1000: messages are capped at max(4 MiB, 5 B/token + 1 MiB) = 4 MiB.
    router = start_router(max_prompt_tokens=1000)
    registration = WorkerRegistration(router.target, role="both", capacity_blocks=100, worker_id=1)
    registration.start_background()
    yield router
    registration.stop_background(deregister=False)


def test_a_prompt_over_the_limit_is_invalid(router):
    with pytest.raises(RouterError) as refused:
        router.client.route(list(range(1001)))
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "at most 1000" in refused.value.message
    assert router.client.route(prompt(1, 2)).decode_worker == 1


def test_a_message_over_the_size_limit_is_resource_exhausted(router):
    with pytest.raises(RouterError) as refused:
        router.client.route(list(range(1_500_000)))  # 6 MB of tokens
    assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert router.client.route(prompt(1, 2)).decode_worker == 1


def test_an_oversized_event_batch_is_refused_and_events_go_on(router):
    tokens = [2**31 + i for i in range(70_000 * 16)]  # 5 bytes each on the wire: 5.6 MB
    huge = pb.StoredEvent(block_ids=list(range(1, 70_001)), token_ids=tokens)
    hello = pb.PublishHello(worker_id=1, next_seq=0, block_size=16)
    requests = [
        pb.PublishRequest(hello=hello),
        pb.PublishRequest(batch=pb.EventBatch(seq=0, events=[pb.KvEvent(stored=huge)])),
    ]
    with grpc.insecure_channel(
        router.target, options=[("grpc.max_send_message_length", 64 << 20)]
    ) as channel:
        replies = router_pb2_grpc.KvEventsStub(channel).Publish(iter(requests), timeout=10)
        with pytest.raises(grpc.RpcError) as refused:
            list(replies)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert router.index_blocks() == {}

    publisher = KvEventPublisher(router.target, 1).start()
    try:
        publisher.stored(None, [1, 2], prompt(1, 2))
        assert publisher.flush(timeout=10)
        assert router.index_blocks() == {1: 2}
    finally:
        publisher.close(timeout=2)
