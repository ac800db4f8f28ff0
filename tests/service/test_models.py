"""One router, several models: each request is decided among the workers of
the model it names, each model's blocks hash in a namespace of its own, and
a model no worker serves is NOT_FOUND. Real routers on 127.0.0.1, with
registrations and event streams as workers make them."""

from __future__ import annotations

import grpc
import pytest

from kvrouter.client import InvalidArgument, NotFound, Unavailable, WorkerRegistration
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

from .helpers import BLOCK, prompt

REQUESTS = 24


def serving(router, models: dict[int, str], **kwargs) -> None:
    for worker_id, model in models.items():
        router.worker(worker_id, model=model, **kwargs)


def decode_workers(client, model: str, seeds=range(REQUESTS)) -> set[int]:
    """Where requests for `model` go, booked all at once so that they spread."""
    results = [client.route(prompt(seed, 4), model=model) for seed in seeds]
    for result in results:
        client.cancelled(result.request_id)
    return {result.decode_worker for result in results}


def overlaps(client, tokens: list[int], model: str) -> dict[int, int]:
    result = client.route(tokens, model=model, explain=True)
    client.cancelled(result.request_id)
    return {c.worker_id: c.overlap for c in result.explanation.decode_candidates}


def test_route_and_route_stream_keep_each_model_to_its_own_workers(router):
    serving(router, {1: "llama", 2: "llama", 3: "qwen", 4: "qwen", 5: ""})
    client = router.client()
    assert decode_workers(client, "llama") == {1, 2}
    assert decode_workers(client, "qwen") == {3, 4}
    assert decode_workers(client, "") == {5}, "a request naming no model, as before models"
    streamed = client.route_many([prompt(s, 4) for s in range(REQUESTS)], model="qwen")
    assert {r.decode_worker for r in streamed} <= {3, 4}
    for r in streamed:
        client.cancelled(r.request_id)


def test_a_model_no_worker_serves_is_not_found_and_names_it(router):
    serving(router, {1: "llama"})
    client = router.client()
    with pytest.raises(NotFound, match='"mistral"') as refused:
        client.route(prompt(1, 4), model="mistral")
    assert "\n" not in str(refused.value)
    [streamed] = client.route_many([prompt(1, 4)], model="mistral", return_exceptions=True)
    assert isinstance(streamed, NotFound)
    with pytest.raises(Unavailable):
        client.route(prompt(1, 4))  # the unnamed model: known, but no worker serves it


def test_a_known_model_with_no_routable_worker_is_unavailable(router):
    serving(router, {1: "llama"})
    router.on_loop(router.server.workers.set_stale, 1, True)
    with pytest.raises(Unavailable):
        router.client().route(prompt(1, 4), model="llama")
    assert router.on_loop(router.server.workers.models) == {"llama": 0}


def test_requests_for_an_adapter_go_to_the_workers_that_serve_it(router):
    router.worker(1, model="llama", adapters=["sql"])
    router.worker(2, model="llama")
    client = router.client()
    assert decode_workers(client, "llama:sql") == {1}
    assert decode_workers(client, "llama") == {1, 2}
    with pytest.raises(NotFound, match='"llama:chat"'):
        client.route(prompt(1, 4), model="llama:chat")
    assert router.on_loop(router.server.workers.models) == {
        "llama": 2,
        "llama:sql": 1,
        "sql": 1,
    }


def test_an_adapter_asked_for_by_its_own_name_is_the_one_model_s_adapter(router):
    router.worker(1, model="llama", adapters=["sql"])
    router.worker(2, model="llama")
    client = router.client()
    assert decode_workers(client, "sql") == {1}, "as vLLM serves a LoRA adapter: by its name"
    assert router.on_loop(router.server.workers.canonical_model, "sql") == "llama:sql"
    tokens = prompt(5, 32)
    adapter = router.publisher(1, model="llama:sql")
    adapter.stored(None, list(range(32)), tokens)
    assert adapter.flush(timeout=10)
    assert overlaps(client, tokens, "sql") == {1: 32}, "the same cache as llama:sql"

    router.worker(3, model="qwen", adapters=["sql"])
    with pytest.raises(NotFound, match="llama:sql, qwen:sql"):
        client.route(prompt(1, 4), model="sql")
    assert "sql" not in router.on_loop(router.server.workers.models)


def test_a_prefix_is_reused_within_its_model_and_never_across_models(router):
    serving(router, {1: "llama", 2: "llama", 3: "qwen", 4: "qwen"})
    tokens = prompt(7, 32)
    block_ids = list(range(32))
    llama = router.publisher(1, model="llama")
    llama.stored(None, block_ids, tokens)
    assert llama.flush(timeout=10)
    client = router.client()
    assert overlaps(client, tokens, "llama") == {1: 32, 2: 0}
    assert overlaps(client, tokens, "qwen") == {3: 0, 4: 0}, "llama's blocks are no hit for qwen"

    qwen = router.publisher(4, model="qwen")
    qwen.stored(None, block_ids, tokens)
    assert qwen.flush(timeout=10)
    assert overlaps(client, tokens, "qwen") == {3: 0, 4: 32}
    assert overlaps(client, tokens, "llama") == {1: 32, 2: 0}
    salted = client.route(tokens, model="llama", namespace="tenant-a", explain=True)
    client.cancelled(salted.request_id)
    assert all(c.overlap == 0 for c in salted.explanation.decode_candidates)


def test_a_worker_registered_again_with_another_model_moves_pools(router):
    serving(router, {2: "qwen"})
    first = router.worker(1, model="llama")
    client = router.client()
    assert decode_workers(client, "llama", range(4)) == {1}
    first.stop_background(deregister=False)
    again = WorkerRegistration(
        router.target, role="both", capacity_blocks=100_000, worker_id=1, model="qwen"
    )
    again.start_background()
    try:
        with pytest.raises(NotFound, match='"llama"'):
            client.route(prompt(1, 4), model="llama")
        assert decode_workers(client, "qwen") == {1, 2}
        listed = {w.worker_id: w.model for w in client.list_workers()}
        assert listed == {1: "qwen", 2: "qwen"}
    finally:
        again.stop_background(deregister=False)


def test_list_returns_each_workers_model_and_adapters(router):
    router.worker(1, model="llama", adapters=["sql", "chat"])
    router.worker(2)
    listed = {w.worker_id: (w.model, w.adapters) for w in router.client().list_workers()}
    assert listed == {1: ("llama", ("sql", "chat")), 2: ("", ())}


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"model": "llama:sql"}, "separates an adapter"),
        ({"model": "m" * 257}, "model is 257 characters"),
        ({"model": "llama\n"}, "model must not contain control characters"),
        ({"model": "llama", "adapters": ["a:b"]}, "separates an adapter"),
        ({"model": "llama", "adapters": [""]}, "an adapter name is empty"),
        ({"model": "llama", "adapters": ["a" * 257]}, "adapter is 257 characters"),
        ({"model": "llama", "adapters": [f"a{i}" for i in range(65)]}, "65 adapters"),
        ({"adapters": ["sql"]}, "adapters need the model"),
    ],
)
def test_registrations_with_bad_model_names_are_refused(router, fields, reason):
    with grpc.insecure_channel(router.target) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            router_pb2_grpc.RegistryStub(channel).Register(
                pb.RegisterRequest(
                    role=pb.ROLE_BOTH, block_size=BLOCK, capacity_blocks=10, **fields
                ),
                timeout=5,
            )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason in refused.value.details()


def test_a_requested_model_is_checked_like_a_namespace(router):
    serving(router, {1: "llama"})
    client = router.client()
    with pytest.raises(InvalidArgument, match="model is 257 characters"):
        client.route(prompt(1, 4), model="m" * 257)
    with pytest.raises(InvalidArgument, match="control characters"):
        client.route(prompt(1, 4), model="llama\n")
    assert decode_workers(client, "llama", range(2)) == {1}
