"""Open RouteStream calls are bounded (`max_route_streams`): one more is
refused with RESOURCE_EXHAUSTED, and a closed stream frees its place."""

from __future__ import annotations

import queue

import grpc
import pytest

from kvrouter.proto_gen import router_pb2 as pb

from .helpers import prompt

METHOD = "/kvrouter.v1.Router/RouteStream"


class OpenStream:
    """A RouteStream that has answered one request and stays open."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.requests: queue.Queue = queue.Queue()
        call = channel.stream_stream(METHOD)
        self.responses = call(iter(self.requests.get, None), timeout=60)
        self.requests.put(pb.RouteRequest(tokens=prompt(seed=1, blocks=2)).SerializeToString())
        self.first = next(self.responses)

    def close(self) -> None:
        self.requests.put(None)
        list(self.responses)


def test_one_stream_past_the_limit_is_refused_until_one_closes(start_router):
    router = start_router(max_route_streams=4)
    router.worker(1)
    with grpc.insecure_channel(router.target) as channel:
        streams = [OpenStream(channel) for _ in range(4)]
        with pytest.raises(grpc.RpcError) as refused:
            OpenStream(channel)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_route_streams" in refused.value.details()
        streams.pop().close()
        streams.append(OpenStream(channel))
        for stream in streams:
            stream.close()
