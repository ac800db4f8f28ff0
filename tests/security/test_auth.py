"""Bearer tokens: every refusal (UNAUTHENTICATED, PERMISSION_DENIED), worker
credentials bound to their worker id, and open or closed health/reflection."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from kvrouter.client import Credentials, KvEventPublisher, RouterClient, WorkerRegistration
from kvrouter.client.types import RouterError
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

from .conftest import TOKENS

PROMPT = list(range(64))


def bearer(role: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[role]}"),)


@pytest.fixture
def router(start_router, token_file):
    return start_router(auth_tokens_file=token_file)


@pytest.fixture
def registry(router):
    with grpc.insecure_channel(router.target) as channel:
        yield router_pb2_grpc.RegistryStub(channel)


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value.code()


def register(registry, role: str, worker_id: int | None = None):
    request = pb.RegisterRequest(role=pb.ROLE_BOTH, block_size=16, capacity_blocks=1000)
    if worker_id is not None:
        request.worker_id = worker_id
    return registry.Register(request, metadata=bearer(role), timeout=5)


@pytest.mark.parametrize(
    "metadata",
    [
        (),
        (("authorization", "Bearer nope"),),
        (("authorization", TOKENS["client"]),),  # a known token without the scheme
    ],
)
def test_missing_or_unknown_tokens_are_unauthenticated(router, registry, metadata):
    refused = code_of(lambda: registry.List(pb.ListWorkersRequest(), metadata=metadata, timeout=5))
    assert refused == grpc.StatusCode.UNAUTHENTICATED
    with RouterClient(router.target, credentials=Credentials(token="nope")) as client:
        with pytest.raises(RouterError) as refused:
            client.route(PROMPT)
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_roles_are_limited_to_their_methods(router, registry):
    assert code_of(lambda: register(registry, "client", 1)) == grpc.StatusCode.PERMISSION_DENIED
    with RouterClient(router.target, credentials=Credentials(token=TOKENS["worker:1"])) as client:
        with pytest.raises(RouterError) as refused:
            client.route(PROMPT)
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert "worker credential may not call /kvrouter.v1.Router/Route" in refused.value.message


def test_a_worker_cannot_act_as_another(router, registry):
    own = register(registry, "worker:1")
    assert own.worker_id == 1  # no id given: its own
    register(registry, "admin", 2)
    denied = grpc.StatusCode.PERMISSION_DENIED
    assert code_of(lambda: register(registry, "worker:1", 2)) == denied
    heartbeat = pb.HeartbeatRequest(worker_id=2)
    assert code_of(lambda: registry.Heartbeat(heartbeat, metadata=bearer("worker:1"))) == denied
    leave = pb.DeregisterRequest(worker_id=2)
    assert code_of(lambda: registry.Deregister(leave, metadata=bearer("worker:1"))) == denied

    hello = pb.PublishRequest(hello=pb.PublishHello(worker_id=2, next_seq=0, block_size=16))
    with grpc.insecure_channel(router.target) as channel:
        replies = router_pb2_grpc.KvEventsStub(channel).Publish(
            iter([hello]), metadata=bearer("worker:1"), timeout=5
        )
        assert code_of(lambda: list(replies)) == denied
    # Worker 2 is untouched, and worker 1 may still heartbeat for itself.
    beat = pb.HeartbeatRequest(worker_id=1, registration_token=own.registration_token)
    registry.Heartbeat(beat, metadata=bearer("worker:1"))
    listed = registry.List(pb.ListWorkersRequest(), metadata=bearer("client"))
    assert [w.worker_id for w in listed.workers] == [1, 2]


def test_credentialed_worker_publishes_and_client_routes(router):
    worker = WorkerRegistration(
        router.target,
        role="both",
        capacity_blocks=1000,
        worker_id=1,
        credentials=Credentials(token=TOKENS["worker:1"]),
    )
    worker.start_background()
    publisher = KvEventPublisher(
        router.target, 1, credentials=Credentials(token=TOKENS["worker:1"])
    ).start()
    try:
        publisher.stored(None, [10, 11, 12, 13], PROMPT)
        assert publisher.flush(timeout=10)
        with RouterClient(router.target, credentials=Credentials(token=TOKENS["client"])) as client:
            result = client.route(PROMPT, explain=True)
            assert result.decode_worker == 1
            assert client.list_workers()[0].index_blocks == 4
    finally:
        publisher.close(timeout=2)
        worker.stop_background()


@pytest.mark.parametrize("open_", [True, False])
def test_health_and_reflection_open_or_closed(start_router, token_file, open_):
    router = start_router(auth_tokens_file=token_file, health_open=open_, reflection_open=open_)
    with grpc.insecure_channel(router.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        check = health_pb2.HealthCheckRequest(service="")
        if open_:
            assert health.Check(check, timeout=5).status == health_pb2.HealthCheckResponse.SERVING
            assert "kvrouter.v1.Router" in ProtoReflectionDescriptorDatabase(channel).get_services()
        else:
            assert (
                code_of(lambda: health.Check(check, timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
            )
            with pytest.raises(grpc.RpcError):
                ProtoReflectionDescriptorDatabase(channel).get_services()
            answer = health.Check(check, metadata=bearer("worker:1"), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_a_bad_token_file_is_refused_at_start(start_router, tmp_path):
    path = tmp_path / "tokens"
    path.write_text("worker:x some-token\n")
    with pytest.raises(
        ValueError, match="role must be client, router, metrics, admin or worker:ID"
    ):
        start_router(auth_tokens_file=str(path))
