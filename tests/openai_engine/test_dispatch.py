"""The router in front of OpenAI-compatible engines: a real `kvrouter
serve` with its front door, and two stub engines on 127.0.0.1 registered
through the Registry API (with heartbeats) as WORKER_PROTOCOL_OPENAI, as
the sidecar registers vLLM and SGLang. Requests go in through the `openai`
SDK and reach the engines over HTTP as the router's token ids; failures
before the first token move to the other engine, later ones end the
answer with an error, and every path closes its booking."""

from __future__ import annotations

import urllib.error
import urllib.request

import grpc
import openai
import pytest
from serve_process import ServeProcess
from waiting import wait_until

from kvrouter.client import RouterClient, WorkerLoad
from kvrouter.demo.cluster import free_port
from kvrouter.engine.tiny_tokenizer import write_tiny_tokenizer
from kvrouter.frontend import ModelTokenizer
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

from .helpers import MODEL, booked, probe, register
from .stub import StubEngine

TOKENS = {"a": list(range(40, 60)), "b": list(range(70, 90))}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer")
    write_tiny_tokenizer(path, vocab_size=256, model_max_length=65_536)
    return path


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return ModelTokenizer.from_dir(tokenizer_dir)


def start_router(tokenizer_dir, *flags: str) -> ServeProcess:
    return ServeProcess(
        "--http-listen",
        f"127.0.0.1:{free_port()}",
        "--served-models",
        f"{MODEL}={tokenizer_dir}",
        *flags,
    )


def front_door(router) -> openai.OpenAI:
    base = f"http://127.0.0.1:{router.wait_for('router serving')['http_port']}/v1"
    return openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def router(tokenizer_dir):
    process = start_router(tokenizer_dir)
    yield process
    process.kill()


@pytest.fixture(scope="module")
def engines(router):
    stubs = {name: StubEngine(tokens).start() for name, tokens in TOKENS.items()}
    registrations = {name: register(router.target, stub) for name, stub in stubs.items()}
    yield {name: (stub, registrations[name].worker_id) for name, stub in stubs.items()}
    for registration in registrations.values():
        registration.stop_background()
    for stub in stubs.values():
        stub.stop()


@pytest.fixture
def client(router, engines):
    for stub, _ in engines.values():
        stub.mode = "ok"
        stub.received.clear()
        stub.peers.clear()
        stub.load = WorkerLoad()
    with front_door(router) as client:
        yield client
    wait_until(lambda: not any(booked(router.target).values()), what="every booking to be closed")


def served_by(engines, tokenizer, text: str) -> str:
    """Which stub's tokens `text` is (a prefix of them)."""
    for name, (stub, _) in engines.items():
        if any(text == tokenizer.decode(stub.tokens[:n]) for n in range(1, len(stub.tokens) + 1)):
            return name
    raise AssertionError(f"{text!r} is no stub's tokens")


def test_answers_are_the_engines_tokens_and_it_gets_the_routers(client, engines, tokenizer):
    prompt = "The quick brown fox jumps over the lazy dog."
    answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0)
    name = served_by(engines, tokenizer, answer.choices[0].text)
    stub, _ = engines[name]
    assert answer.choices[0].text == tokenizer.decode(stub.tokens[:5])
    assert answer.choices[0].finish_reason == "length"
    (body,) = stub.received
    assert body["prompt"] == tokenizer.encode(prompt)
    assert body["model"] == MODEL
    assert body["max_tokens"] == 5
    assert body["temperature"] == 0
    assert body["stream"] is True and body["return_token_ids"] is True

    stream = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=50, stream=True, seed=7, top_p=0.5
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    stub, _ = engines[served_by(engines, tokenizer, text)]
    assert text == tokenizer.decode(stub.tokens)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert stub.received[-1]["prompt"] == tokenizer.encode(prompt)
    assert (stub.received[-1]["seed"], stub.received[-1]["top_p"]) == (7, 0.5)


def test_a_cache_salt_reaches_the_engine_as_vllms_field(client, engines):
    client.completions.create(
        model=MODEL, prompt="salted", max_tokens=2, extra_body={"cache_salt": "tenant-a"}
    )
    client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "salted"}],
        max_tokens=2,
        extra_body={"cache_salt": "tenant-b"},
    )
    client.completions.create(model=MODEL, prompt="plain", max_tokens=2)
    bodies = [body for stub, _ in engines.values() for body in stub.received]
    assert sorted(body.get("cache_salt", "") for body in bodies) == ["", "tenant-a", "tenant-b"]


@pytest.mark.parametrize("salt", ["", "x" * 257, "tab\there", 7, ["tenant-a"]])
def test_a_cache_salt_that_is_no_short_printable_string_is_a_400(client, engines, salt):
    with pytest.raises(openai.BadRequestError, match="cache_salt") as refused:
        client.completions.create(
            model=MODEL, prompt="salted", max_tokens=2, extra_body={"cache_salt": salt}
        )
    assert refused.value.body["type"] == "invalid_request_error"
    assert not any(stub.received for stub, _ in engines.values())


def test_a_long_prompt_whose_first_event_spans_many_reads(client, engines):
    # The first event echoes the prompt's ids: some 200 KB of JSON, more
    # than a line reader takes, read in many pieces.
    prompt = [3 + i % 250 for i in range(40_000)]
    answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4)
    (stub,) = [stub for stub, _ in engines.values() if stub.received]
    assert stub.received[0]["prompt"] == prompt
    assert answer.usage.completion_tokens == 4


def test_requests_in_turn_share_a_kept_alive_connection(client, engines):
    # Three requests to two engines: one engine gets two.
    for i in range(3):
        client.completions.create(model=MODEL, prompt=f"again {i}", max_tokens=2)
    assert max(len(stub.peers) for stub, _ in engines.values()) >= 2
    assert all(len(set(stub.peers)) <= 1 for stub, _ in engines.values())


def test_an_engine_that_answers_503_is_passed_over_for_the_other(
    client, router, engines, tokenizer
):
    failing, failing_id = engines["a"]
    healthy, healthy_id = engines["b"]
    failing.mode = "unavailable"
    # The healthy engine reports a long queue, so the router picks the failing one first.
    healthy.load = WorkerLoad(queued_prefill_tokens=1_000_000)

    def queue_heard() -> bool:
        costs = {c.worker_id: c.cost_ms for c in probe(router.target).explanation.decode_candidates}
        return costs[healthy_id] > costs[failing_id]

    # (Until then the two tie, and ties are taken in turn.)
    wait_until(queue_heard, what="the queue to be heard")
    answer = client.completions.create(model=MODEL, prompt="question", max_tokens=3)
    assert answer.choices[0].text == tokenizer.decode(healthy.tokens[:3])
    (refused,) = failing.received
    (answered,) = healthy.received
    assert answered["prompt"] == refused["prompt"]


def test_a_connection_cut_mid_stream_ends_with_an_error_event(client, engines):
    for stub, _ in engines.values():
        stub.mode = "drop"
    stream = client.completions.create(model=MODEL, prompt="cut me", max_tokens=10, stream=True)
    with pytest.raises(openai.APIError, match="failed after 2 tokens"):
        for _ in stream:
            pass


def test_a_request_the_engine_refuses_is_not_retried(client, engines):
    for stub, _ in engines.values():
        stub.mode = "refuse"
    with pytest.raises(openai.BadRequestError, match="the engine refused the request"):
        client.completions.create(model=MODEL, prompt="refused", max_tokens=3)
    assert sum(len(stub.received) for stub, _ in engines.values()) == 1


def test_a_client_gone_mid_stream_reaches_the_engine_and_closes_the_booking(
    client, router, engines
):
    for stub, _ in engines.values():
        stub.mode = "hold"
    stream = client.completions.create(model=MODEL, prompt="hold on", max_tokens=10, stream=True)
    next(iter(stream))
    assert sum(booked(router.target).values()) == 1
    stream.close()
    wait_until(
        lambda: sum(stub.disconnects for stub, _ in engines.values()) == 1,
        what="the engine to see the router leave",
    )
    wait_until(lambda: not any(booked(router.target).values()), what="the booking to be closed")


def test_the_deadline_ends_a_hung_engine(tokenizer_dir, engines):
    stub, _ = engines["a"]
    stub.mode = "hang"
    stub.disconnects = 0
    # A router of its own, whose requests' deadline (the front door sets
    # none) is short, where the module's router waits minutes.
    process = start_router(tokenizer_dir, "--proxy", "default_timeout_s=3")
    registration = register(process.target, stub)
    try:
        with front_door(process) as client, pytest.raises(openai.APIStatusError) as raised:
            client.completions.create(model=MODEL, prompt="are you there", max_tokens=3)
        assert raised.value.status_code == 504
        wait_until(lambda: stub.disconnects == 1, what="the hung engine to see the router leave")
        wait_until(
            lambda: not any(booked(process.target).values()), what="the booking to be closed"
        )
    finally:
        registration.stop_background()
        process.kill()
        stub.mode = "ok"


def test_an_engine_needs_a_url_and_its_protocol_is_listed(router, engines):
    with grpc.insecure_channel(router.target) as channel:
        registry = router_pb2_grpc.RegistryStub(channel)
        for address in ("127.0.0.1:8000", "", "ftp://127.0.0.1:8000"):
            with pytest.raises(grpc.RpcError) as refused:
                registry.Register(
                    pb.RegisterRequest(
                        role=pb.ROLE_BOTH,
                        address=address,
                        block_size=16,
                        capacity_blocks=100,
                        protocol=pb.WORKER_PROTOCOL_OPENAI,
                    ),
                    timeout=5,
                )
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "base URL" in refused.value.details()
    with RouterClient(router.target) as probe:
        listed = {w.worker_id: (w.protocol, w.address) for w in probe.list_workers()}
    assert listed == {worker_id: ("openai", stub.url) for stub, worker_id in engines.values()}


def _stop(registrations, stubs, router) -> None:
    """Deregisters the engines, stops their stubs and kills the router."""
    for registration in registrations:
        registration.stop_background()
    for stub in stubs:
        stub.stop()
    router.kill()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        return refused.code


def test_ready_once_a_worker_can_answer_not_a_prefill_engine_alone(tokenizer_dir):
    """A prefill engine cannot answer a request by itself: until a
    decode-capable one registers, /ready is 503 and /v1/models lists
    nothing, so a readiness probe sends no request that would get a 503."""
    router = start_router(tokenizer_dir)
    stubs = [StubEngine(TOKENS["a"]).start() for _ in range(2)]
    registrations = []
    try:
        ready = f"http://127.0.0.1:{router.wait_for('router serving')['http_port']}/ready"
        registrations.append(register(router.target, stubs[0], role="prefill"))
        with RouterClient(router.target) as probe_client:
            wait_until(lambda: probe_client.list_workers(), what="the prefill engine to register")
        with front_door(router) as client:
            assert _status(ready) == 503
            assert [m.id for m in client.models.list()] == []
            registrations.append(register(router.target, stubs[1]))
            wait_until(lambda: _status(ready) == 200, what="the front door to be ready")
            assert [m.id for m in client.models.list()] == [MODEL]
            answer = client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=2)
            assert answer.choices[0].finish_reason
    finally:
        _stop(registrations, stubs, router)


def test_an_adapter_is_asked_for_by_its_own_name_as_vllm_serves_it(router, client, tokenizer):
    stub = StubEngine(list(range(100, 110))).start()
    registration = register(router.target, stub, adapters=["sql"])
    try:
        wait_until(
            lambda: "sql" in {m.id for m in client.models.list()},
            what="the adapter to be listed by its own name",
        )
        assert f"{MODEL}:sql" in {m.id for m in client.models.list()}
        answer = client.completions.create(model="sql", prompt="select", max_tokens=3)
        assert answer.model == "sql"
        assert answer.choices[0].text == tokenizer.decode(stub.tokens[:3])
        (body,) = stub.received
        assert body["model"] == "sql", "the engine serves the adapter under its own name"
    finally:
        registration.stop_background()
        stub.stop()


def test_a_served_models_name_never_stands_for_another_models_adapter(tokenizer_dir):
    """`ghost` is a model this front door serves, with no worker up, and an
    adapter of `tiny`: a request for `ghost` is not sent to `tiny:ghost`
    (it would be tokenized as one model and answered by another), /ready
    counts no worker for it, and `tiny:ghost` still answers."""
    router = ServeProcess(
        "--http-listen",
        f"127.0.0.1:{free_port()}",
        "--served-models",
        f"{MODEL}={tokenizer_dir},ghost={tokenizer_dir}",
    )
    stub = StubEngine(TOKENS["a"]).start()
    registration = register(router.target, stub, adapters=["ghost"])
    try:
        ready = f"http://127.0.0.1:{router.wait_for('router serving')['http_port']}/ready"
        with front_door(router) as client:
            wait_until(lambda: client.models.list().data, what="the engine to be listed")
            assert [m.id for m in client.models.list()] == [MODEL, f"{MODEL}:ghost"]
            assert _status(ready) == 503, "no worker serves ghost itself"
            with pytest.raises(openai.NotFoundError):
                client.completions.create(model="ghost", prompt="boo", max_tokens=2)
            assert not stub.received
            client.completions.create(model=f"{MODEL}:ghost", prompt="boo", max_tokens=2)
            assert [body["model"] for body in stub.received] == ["ghost"]
    finally:
        registration.stop_background()
        stub.stop()
        router.kill()


def test_an_adapter_several_models_have_is_a_404_naming_them(tokenizer_dir):
    """`sql` and `ghost` are adapters of two models; `ghost` is also a model
    the front door serves, with no worker up."""
    router = ServeProcess(
        "--http-listen",
        f"127.0.0.1:{free_port()}",
        "--served-models",
        f"{MODEL}={tokenizer_dir},other={tokenizer_dir},ghost={tokenizer_dir}",
    )
    stubs = [StubEngine(TOKENS["a"]).start(), StubEngine(TOKENS["b"]).start()]
    registrations = [
        register(router.target, stub, model=model, adapters=["sql", "ghost"])
        for stub, model in zip(stubs, (MODEL, "other"), strict=True)
    ]
    try:
        ready = f"http://127.0.0.1:{router.wait_for('router serving')['http_port']}/ready"
        with front_door(router) as client:
            wait_until(
                lambda: len(client.models.list().data) == 6, what="both engines to be listed"
            )
            with pytest.raises(openai.NotFoundError) as refused:
                client.completions.create(model="sql", prompt="select", max_tokens=2)
            message = refused.value.body["message"]
            assert f"{MODEL}:sql" in message and "other:sql" in message
            # A model it serves is that model, whoever has an adapter of its name.
            with pytest.raises(openai.NotFoundError) as refused:
                client.completions.create(model="ghost", prompt="boo", max_tokens=2)
            assert "adapter" not in refused.value.body["message"]
            assert _status(ready) == 503, "no worker serves ghost itself"
            assert not any(stub.received for stub in stubs)
            client.completions.create(model="other:sql", prompt="select", max_tokens=2)
            assert [body["model"] for body in stubs[1].received] == ["sql"]
    finally:
        _stop(registrations, stubs, router)


@pytest.mark.parametrize("stop", ["token id", "string"])
def test_logprobs_end_at_the_token_that_stops_an_engine_s_chunk(client, engines, tokenizer, stop):
    # Each stub sends all its tokens in one choice; the answer stops at its fourth.
    for stub, _ in engines.values():
        stub.mode = "one_event"
    fourth = [stub.tokens[3] for stub, _ in engines.values()]
    cut = (
        {"extra_body": {"stop_token_ids": fourth}}
        if stop == "token id"
        else {"stop": [tokenizer.decode([t]) for t in fourth]}
    )
    answer = client.completions.create(
        model=MODEL, prompt="hi", max_tokens=12, logprobs=0, temperature=0, **cut
    )
    got = answer.choices[0].logprobs
    (stub,) = [stub for stub, _ in engines.values() if stub.received]
    assert got.tokens == [tokenizer.token_texts.of(t)[0] for t in stub.tokens[:4]]
    assert got.token_logprobs == pytest.approx([-0.1, -0.2, -0.3, -0.4])
    assert answer.choices[0].finish_reason == "stop"


def test_an_engine_that_streams_no_logprobs_fails_the_request_alone(client, engines):
    for stub, _ in engines.values():
        stub.mode = "no_logprobs"
    with pytest.raises(openai.APIStatusError) as refused:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=3, logprobs=1)
    assert refused.value.status_code == 501
    assert "no log probabilities" in refused.value.body["message"]
    # Not tried again elsewhere: another engine of the kind would fail alike.
    assert sum(len(stub.received) for stub, _ in engines.values()) == 1
    answer = client.completions.create(model=MODEL, prompt="hi", max_tokens=3)
    assert answer.choices[0].finish_reason == "length"
