"""`session_id` over gRPC: Route through a `kvrouter serve` process on
127.0.0.1, where a session's turns stay on its worker while the candidates
tie and turns without one spread, and proxied Generate, which books its
session the same way; a bad session id is INVALID_ARGUMENT."""

from __future__ import annotations

import urllib.request

import grpc
import pytest
from serve_process import ServeProcess

from kvrouter.client import WorkerRegistration
from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

from .helpers import prompt


@pytest.fixture
def stub():
    router = ServeProcess()
    workers = [
        WorkerRegistration(router.target, role="both", capacity_blocks=1000, worker_id=w)
        for w in (1, 2, 3)
    ]
    try:
        for worker in workers:
            worker.start_background()
        with grpc.insecure_channel(router.target) as channel:
            yield router_pb2_grpc.RouterStub(channel)
        for worker in workers:
            worker.stop_background(deregister=False)
        assert router.terminate() == 0
    finally:
        router.kill()


def finished_turn(stub, request_id: str, seed: int, session: str = "") -> pb.RouteResponse:
    request = pb.RouteRequest(request_id=request_id, tokens=prompt(seed, 4), session_id=session)
    response = stub.Route(request, timeout=10)
    report = pb.LifecycleReport(request_id=request_id, event=pb.LIFECYCLE_EVENT_FINISHED)
    stub.ReportLifecycle(report, timeout=10)
    return response


def test_route_with_a_session_id_sticks_to_its_worker(stub):
    plain = {finished_turn(stub, f"p{n}", n).decode_worker for n in range(6)}
    assert len(plain) > 1, plain

    first = finished_turn(stub, "s0", 100, session="chat-7")
    later = [finished_turn(stub, f"s{n}", 100 + n, session="chat-7") for n in range(1, 6)]
    assert {r.decode_worker for r in later} == {first.decode_worker}
    assert all("session affinity" in r.explanation.reason for r in later)


def test_a_session_id_past_the_limit_is_invalid(stub):
    request = pb.RouteRequest(tokens=prompt(1, 1), session_id="s" * 257)
    with pytest.raises(grpc.RpcError) as refused:
        stub.Route(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "session_id" in refused.value.details()


def affinity_decisions(router) -> float:
    url = f"http://127.0.0.1:{router.server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("kvrouter_session_affinity_total "):
                return float(line.split()[1])
    raise AssertionError("no kvrouter_session_affinity_total")


def test_generate_routes_with_its_session_id(router):
    """A proxied Generate books its session's worker: here the workers are
    unreachable, so the call fails, but a Route of the same session then
    goes where the Generate was sent."""
    for w in (1, 2):
        router.worker(w, address="127.0.0.1:1")
    with grpc.insecure_channel(router.target) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        request = gen.GenerateRequest(
            tokens=prompt(1, 4), session_id="chat-9", sampling=gen.SamplingParams(max_tokens=1)
        )
        with pytest.raises(grpc.RpcError) as failed:
            list(stub.Generate(request, timeout=10))
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        route = pb.RouteRequest(tokens=prompt(2, 4), session_id="chat-9")
        assert "session affinity" in stub.Route(route, timeout=10).explanation.reason
        assert affinity_decisions(router) == 1

        request.session_id = "s\n"
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.Generate(request, timeout=10))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "session_id" in refused.value.details()
