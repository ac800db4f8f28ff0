"""Each refused call answers its status code with an actionable message, and
leaves the router's state as it was."""

from __future__ import annotations

import grpc
import pytest

from kvrouter.client import DeadlineExceeded, InvalidArgument, NotFound, Unavailable
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

from .helpers import BLOCK, prompt


@pytest.fixture
def stubs(router):
    channel = grpc.insecure_channel(router.target)
    yield router_pb2_grpc.RouterStub(channel), router_pb2_grpc.RegistryStub(channel)
    channel.close()


def state(router):
    """The index as a refused input must leave it, once sized for the workers."""
    router.server.index.wait_sized()
    return router.on_loop(lambda: (router.server.index.stats(), router.server.index.workers()))


def test_bad_prompts_are_invalid_and_change_nothing(start_router):
    router = start_router(max_prompt_tokens=64 * BLOCK, max_namespace_chars=8)
    router.worker(1)
    client = router.client()
    client.route(prompt(seed=1, blocks=4), request_id="kept")
    before = state(router)

    with pytest.raises(InvalidArgument, match="empty"):
        client.route([])
    with pytest.raises(InvalidArgument, match="at most 1024"):
        client.route(prompt(seed=2, blocks=65))
    with pytest.raises(InvalidArgument, match="namespace"):
        client.route(prompt(seed=2, blocks=1), namespace="x" * 9)
    with pytest.raises(InvalidArgument, match="control characters"):
        client.route(prompt(seed=2, blocks=1), namespace="a\nb")
    with pytest.raises(InvalidArgument, match="already"):
        client.route(prompt(seed=2, blocks=1), request_id="kept")

    assert state(router) == before
    client.finished("kept")  # the original booking is still there to release


def test_both_token_encodings_at_once_is_invalid(router, stubs):
    router.worker(1)
    route, _ = stubs
    with pytest.raises(grpc.RpcError) as e:
        route.Route(pb.RouteRequest(tokens=[1, 2], tokens_u32le=b"\0\0\0\0"))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        route.Route(pb.RouteRequest(tokens_u32le=b"\0\0\0"))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Plain repeated tokens work (what grpcurl users send).
    assert route.Route(pb.RouteRequest(tokens=list(range(40)))).decode_worker == 1


def test_no_healthy_worker_is_unavailable(router):
    client = router.client()
    with pytest.raises(Unavailable, match="no"):
        client.route(prompt(seed=1, blocks=2))


def test_unknown_worker_is_not_found(router, stubs):
    _, registry = stubs
    for call, request in (
        (registry.Heartbeat, pb.HeartbeatRequest(worker_id=99)),
        (registry.Deregister, pb.DeregisterRequest(worker_id=99)),
    ):
        with pytest.raises(grpc.RpcError) as e:
            call(request)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert "worker 99 is not registered" in e.value.details()


def test_bad_registrations_are_invalid(router, stubs):
    _, registry = stubs
    bad = [
        pb.RegisterRequest(role=pb.ROLE_BOTH, block_size=32, capacity_blocks=10),
        pb.RegisterRequest(role=pb.ROLE_UNSPECIFIED, block_size=BLOCK, capacity_blocks=10),
        pb.RegisterRequest(role=pb.ROLE_BOTH, block_size=BLOCK, capacity_blocks=0),
    ]
    for request in bad:
        with pytest.raises(grpc.RpcError) as e:
            registry.Register(request)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not match the router's 16" in _details(registry.Register, bad[0])
    assert router.client().list_workers() == []


def _details(call, request) -> str:
    try:
        call(request)
    except grpc.RpcError as e:
        return e.details()
    raise AssertionError("the call succeeded")


def test_lifecycle_errors(router, stubs):
    route, _ = stubs
    with pytest.raises(grpc.RpcError) as e:
        route.ReportLifecycle(pb.LifecycleReport(request_id="", event=pb.LIFECYCLE_EVENT_FINISHED))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        route.ReportLifecycle(pb.LifecycleReport(request_id="r"))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_passed_deadline_is_deadline_exceeded(router):
    router.worker(1)
    client = router.client()
    with pytest.raises(DeadlineExceeded):
        client.route(prompt(seed=1, blocks=8), request_id="late", timeout=-1)
    # Nothing was booked for it: the same request id routes.
    assert client.route(prompt(seed=1, blocks=8), request_id="late").decode_worker == 1


def test_route_stream_reports_errors_per_request(router):
    router.worker(1)
    results = router.client().route_many(
        [prompt(seed=1, blocks=1), [], prompt(seed=2, blocks=1)], return_exceptions=True
    )
    assert [type(r).__name__ for r in results] == ["RouteResult", "InvalidArgument", "RouteResult"]


def test_deregistered_worker_is_gone(router):
    registration = router.worker(5)
    registration.stop_background(deregister=True)
    assert router.client().list_workers() == []


def test_finishing_an_unknown_request_is_not_found(router):
    router.worker(1)
    client = router.client()
    with pytest.raises(NotFound):
        client.finished("never-routed")
