"""Bytes that do not parse as the method's request are INVALID_ARGUMENT on
every method of a real router, unary or streaming, and leave it serving."""

from __future__ import annotations

import grpc
import pytest

from kvrouter.client import RouterClient

GARBAGE = b"\xff\xff\xff\xff\x0f"
UNARY = [
    "/kvrouter.v1.Registry/Register",
    "/kvrouter.v1.Registry/Heartbeat",
    "/kvrouter.v1.Registry/Deregister",
    "/kvrouter.v1.Registry/List",
    "/kvrouter.v1.Router/ReportLifecycle",
]


@pytest.fixture
def router(start_router):
    return start_router()


@pytest.mark.parametrize("method", UNARY)
def test_unary_methods(router, method):
    with grpc.insecure_channel(router.target) as channel:
        call = channel.unary_unary(method)
        with pytest.raises(grpc.RpcError) as refused:
            call(GARBAGE, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed" in refused.value.details()


def test_generate(router):
    with grpc.insecure_channel(router.target) as channel:
        call = channel.unary_stream("/kvrouter.v1.Router/Generate")
        with pytest.raises(grpc.RpcError) as refused:
            list(call(GARBAGE, timeout=10))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_publish_stream(router):
    with grpc.insecure_channel(router.target) as channel:
        call = channel.stream_stream("/kvrouter.v1.KvEvents/Publish")
        with pytest.raises(grpc.RpcError) as refused:
            list(call(iter([GARBAGE]), timeout=10))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with RouterClient(router.target) as client:
        assert client.list_workers() == []
