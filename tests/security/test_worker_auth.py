"""The workers' own service with authentication and TLS: who may call it
(the router, admins, peers fetching a hand-off), each refusal's code, and
the router and peers presenting their credentials."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvrouter.client import Credentials
from kvrouter.client.generate import GenerateClient
from kvrouter.net.channels import sync_channel
from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.proto_gen import worker_pb2 as wpb
from kvrouter.proto_gen import worker_pb2_grpc

from .conftest import TOKENS

PROMPT = list(range(3, 83))  # five blocks of 16


def request(request_id: str = "", max_tokens: int = 4) -> gen.GenerateRequest:
    return gen.GenerateRequest(
        request_id=request_id,
        tokens=PROMPT,
        sampling=gen.SamplingParams(max_tokens=max_tokens, ignore_eos=True),
    )


def bearer(role: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[role]}"),)


def own_token(tmp_path, role: str) -> str:
    """A file holding `role`'s token, as a caller keeps it."""
    path = tmp_path / f"{role.replace(':', '-')}.token"
    path.write_text(TOKENS[role] + "\n")
    return str(path)


def tokens_of(stream) -> list[int]:
    return [t for message in stream for t in message.token_ids]


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value.code()


@pytest.fixture
def worker(start_worker, token_file):
    return start_worker(auth_tokens_file=token_file)


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer nope"),)])
def test_a_call_without_a_known_token_is_unauthenticated(worker, metadata):
    refused = code_of(lambda: list(worker.stub.Generate(request(), metadata=metadata, timeout=10)))
    assert refused == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize(
    ("role", "method"),
    [
        ("client", "Generate"),
        ("worker:1", "Generate"),
        ("worker:1", "Prefill"),
        ("client", "FetchBlocks"),
        ("client", "Release"),
    ],
)
def test_roles_other_than_router_and_peers_are_denied(worker, role, method):
    calls = {
        "Generate": lambda: list(
            worker.stub.Generate(request(), metadata=bearer(role), timeout=10)
        ),
        "Prefill": lambda: worker.stub.Prefill(
            wpb.PrefillRequest(request=request()), metadata=bearer(role), timeout=10
        ),
        "FetchBlocks": lambda: list(
            worker.stub.FetchBlocks(
                wpb.FetchBlocksRequest(request_id="r", block_ids=[1]),
                metadata=bearer(role),
                timeout=10,
            )
        ),
        "Release": lambda: worker.stub.Release(
            wpb.ReleaseRequest(request_id="r"), metadata=bearer(role), timeout=10
        ),
    }
    assert code_of(calls[method]) == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize("role", ["router", "admin"])
def test_the_router_credential_generates(worker, role):
    assert len(tokens_of(worker.stub.Generate(request(), metadata=bearer(role), timeout=30))) == 4


def test_a_peer_may_fetch_and_release(worker):
    # Past authorization, an unknown hand-off is the service's own NOT_FOUND.
    fetch = wpb.FetchBlocksRequest(request_id="unknown", block_ids=[1])
    release = wpb.ReleaseRequest(request_id="unknown")
    peer = bearer("worker:2")
    calls = (
        lambda: list(worker.stub.FetchBlocks(fetch, metadata=peer, timeout=10)),
        lambda: worker.stub.Release(release, metadata=peer, timeout=10),
    )
    assert [code_of(call) for call in calls] == [grpc.StatusCode.NOT_FOUND] * 2


@pytest.mark.parametrize(
    ("health_open", "refused"), [(True, None), (False, grpc.StatusCode.UNAUTHENTICATED)]
)
def test_health_is_open_unless_closed(start_worker, token_file, health_open, refused):
    worker = start_worker(auth_tokens_file=token_file, health_open=health_open)
    check = health_pb2_grpc.HealthStub(worker.channel).Check
    if refused is None:
        serving = health_pb2.HealthCheckResponse.SERVING
        assert check(health_pb2.HealthCheckRequest(), timeout=10).status == serving
    else:
        assert code_of(lambda: check(health_pb2.HealthCheckRequest(), timeout=10)) == refused


def hand_off(prefill, decode, request_id: str):
    """Prefill on `prefill`, then Decode on `decode`, as the router does."""
    inner = request(request_id, max_tokens=6)
    handoff = prefill.stub.Prefill(
        wpb.PrefillRequest(request=inner), metadata=bearer("router"), timeout=30
    ).handoff
    stream = decode.stub.Decode(
        wpb.DecodeRequest(request=inner, handoff=handoff), metadata=bearer("router"), timeout=30
    )
    return handoff, list(stream)


def test_a_decode_worker_fetches_from_its_peer_with_its_credential(
    start_worker, token_file, tmp_path
):
    prefill = start_worker(role="prefill", auth_tokens_file=token_file)
    decode = start_worker(
        role="decode", auth_tokens_file=token_file, token_file=own_token(tmp_path, "worker:2")
    )
    handoff, messages = hand_off(prefill, decode, "peer-1")
    assert messages[0].handoff.blocks_transferred == len(handoff.block_ids) > 0
    assert len([t for m in messages for t in m.token_ids]) == 5


def test_a_decode_worker_without_a_credential_is_refused_by_its_peer(start_worker, token_file):
    prefill = start_worker(role="prefill", auth_tokens_file=token_file)
    decode = start_worker(role="decode", auth_tokens_file=token_file, fetch_timeout_s=5.0)
    with pytest.raises(grpc.RpcError) as e:
        hand_off(prefill, decode, "peer-2")
    assert e.value.code() == grpc.StatusCode.ABORTED
    assert "UNAUTHENTICATED" in e.value.details()
    prefill.stub.Release(
        wpb.ReleaseRequest(request_id="peer-2"), metadata=bearer("router"), timeout=10
    )


def test_the_router_presents_its_credential_to_workers(
    start_router, start_worker, token_file, tmp_path
):
    router = start_router(
        auth_tokens_file=token_file, worker_token_file=own_token(tmp_path, "router")
    )
    start_worker(
        router=router.target,
        worker_id=1,
        token_file=own_token(tmp_path, "worker:1"),
        auth_tokens_file=token_file,
    )

    async def generate():
        credentials = Credentials(token=TOKENS["client"])
        async with GenerateClient(router.target, credentials=credentials, timeout=30) as client:
            return await client.generate(PROMPT, max_tokens=4, ignore_eos=True)

    assert len(router.call(generate()).token_ids) == 4


@pytest.mark.parametrize("with_certificate", [True, False])
def test_an_mtls_worker_takes_only_certified_callers(start_worker, ca, tmp_path, with_certificate):
    server = ca.issue("worker", server=True)
    paths = {}
    for name, data in (
        ("tls_cert_file", server.certificate),
        ("tls_key_file", server.private_key),
        ("tls_client_ca_file", ca.certificate),
    ):
        paths[name] = str(tmp_path / f"{name}.pem")
        (tmp_path / f"{name}.pem").write_bytes(data)
    worker = start_worker(**paths)
    credentials = Credentials(root_certificates=ca.certificate)
    if with_certificate:
        router = ca.issue("router", server=False)
        credentials = Credentials(
            root_certificates=ca.certificate,
            certificate_chain=router.certificate,
            private_key=router.private_key,
        )
    with sync_channel(worker.address, credentials, ()) as channel:
        status = worker_pb2_grpc.WorkerStub(channel).Status
        if with_certificate:
            assert status(wpb.StatusRequest(), timeout=10).role == "both"
        else:
            refused = code_of(lambda: status(wpb.StatusRequest(), timeout=10))
            assert refused == grpc.StatusCode.UNAVAILABLE
