"""The OpenAI-compatible front door with the official `openai` SDK, sync and
async, streaming and not, against a real router (`--http-listen`) and CPU
workers on a tiny checkpoint that ships its own tokenizer: greedy answers
equal the engine's own `generate` for the same tokens, errors carry their
status and an OpenAI-shaped body, and a client that goes away mid-stream
leaves no request, lease or pinned block on any worker."""

from __future__ import annotations

import asyncio
import json
import math
import socket

import openai
import pytest
from waiting import wait_until

from kvrouter.demo.cluster import free_port
from kvrouter.frontend import ModelTokenizer

from .conftest import start_cluster
from .helpers import all_idle, http_get, http_post

MODEL = "tiny"
MAX_PROMPT = 300
MAX_REQUESTS = 2
BODY_TIMEOUT_S = 2
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def front_door(tiny_model, tmp_path_factory):
    port = free_port()
    cluster = start_cluster(
        tiny_model,
        tmp_path_factory,
        {},
        [],
        [
            "--http-listen",
            f"127.0.0.1:{port}",
            "--served-models",
            f"{MODEL}={tiny_model}",
            "--max-prompt-tokens",
            str(MAX_PROMPT),
            "--http-max-requests",
            str(MAX_REQUESTS),
            "--http-body-timeout-s",
            str(BODY_TIMEOUT_S),
        ],
        roles=["prefill", "decode"],
        models=[MODEL, MODEL],
    )
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_get(base + "/ready")[0] == 200, what="the front door to be ready")
    yield cluster, base
    cluster.stop()


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return ModelTokenizer.from_dir(tiny_model)


@pytest.fixture
def client(front_door):
    cluster, base = front_door
    with openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0) as client:
        yield client
    wait_until(lambda: all_idle(cluster), what="every worker to be idle")


def test_models_health_and_ready(front_door):
    _, base = front_door
    assert http_get(base + "/health") == (200, {"status": "ok"})
    # One prefill and one decode worker: the decode worker is the routable one.
    assert http_get(base + "/ready") == (200, {"ready": True, "routable_workers": {MODEL: 1}})
    status, models = http_get(base + "/v1/models")
    assert status == 200
    assert [m["id"] for m in models["data"]] == [MODEL]


def test_a_completion_equals_the_engines_greedy_tokens(client, tokenizer, reference):
    prompt = "The quick brown fox jumps over the lazy dog. " * 3
    answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, **GREEDY)
    tokens = tokenizer.encode(prompt)
    assert answer.choices[0].text == tokenizer.decode(reference(tokens, 8))
    assert answer.choices[0].finish_reason == "length"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (len(tokens), 8)


def test_a_prompt_of_token_ids_gets_the_engines_greedy_tokens(client, tokenizer, reference):
    tokens = tokenizer.encode("Pack my box with five dozen liquor jugs. " * 2)
    want = tokenizer.decode(reference(tokens, 8))
    for prompt in (list(tokens), [list(tokens)]):
        answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, **GREEDY)
        assert answer.choices[0].text == want
        assert answer.usage.prompt_tokens == len(tokens)


def test_a_streamed_chat_equals_the_engines_greedy_tokens(client, tokenizer, reference):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say something about caches, 键值缓存 🚀"},
    ]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    tokens = tokenizer.render_and_encode(messages).token_ids
    assert text == tokenizer.decode(reference(tokens, 12))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12


def test_the_async_client_streams_completions(front_door, tokenizer, reference):
    _, base = front_door

    async def run() -> str:
        async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused") as client:
            stream = await client.completions.create(
                model=MODEL, prompt="Hello there", max_tokens=6, stream=True, **GREEDY
            )
            return "".join([c.choices[0].text async for c in stream])

    assert asyncio.run(run()) == tokenizer.decode(reference(tokenizer.encode("Hello there"), 6))


def test_a_stop_string_ends_the_answer_before_it(client, tokenizer, reference):
    prompt = "Once upon a time"
    full = tokenizer.decode(reference(tokenizer.encode(prompt), 16))
    stop = full[3:6]
    answer = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=16, stop=[stop], **GREEDY
    )
    assert answer.choices[0].text == full[: full.index(stop)]
    assert answer.choices[0].finish_reason == "stop"


def test_a_client_gone_mid_stream_frees_the_workers(front_door, client):
    cluster, _ = front_door
    stream = client.completions.create(
        model=MODEL, prompt="a long answer please", max_tokens=200, stream=True, **GREEDY
    )
    next(iter(stream))
    stream.close()
    wait_until(lambda: all_idle(cluster), what="the cancelled request to leave the workers")


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"top_logprobs": 2}, "needs logprobs: true"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": 3}, "logprobs must be true or false"),
    ],
)
def test_bad_chat_logprobs_are_a_400(front_door, fields, says):
    _, base = front_door
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}
    got, _, answer = http_post(base + "/v1/chat/completions", json.dumps(body).encode())
    assert (got, says in answer["error"]["message"]) == (400, True)


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"model": "nope", "prompt": "hi"}, 404, "does not exist"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": "hi", "temperature": 1e-45}, 400, "temperature"),
        ({"model": MODEL, "prompt": list(range(MAX_PROMPT + 1))}, 413, "at most"),
        ({"model": MODEL, "prompt": "hi", "n": 2}, 400, "n=1"),
        ({"model": MODEL, "prompt": "hi", "stop": ""}, 400, "stop"),
        ({"model": MODEL, "prompt": "hi", "stop": ["x"] * 17}, 400, "at most 16"),
        ({"model": MODEL, "prompt": "hi", "stop": ["x" * 257]}, 400, "stop"),
        ({"model": MODEL, "prompt": "hi", "top_k": -2}, 400, "top_k"),
        ({"model": MODEL, "prompt": "hi", "top_p": 0}, 400, "top_p"),
        ({"model": MODEL, "prompt": "hi", "stop_token_ids": [-1]}, 400, "stop_token_ids"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": 5_000_000_000}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": 2048}, 400, "context is 2048 tokens"),
        ({"model": MODEL, "prompt": "hi", "echo": True}, 400, "echo"),
        ({"model": MODEL, "prompt": "hi", "logprobs": 21}, 400, "logprobs"),
        ({"model": MODEL, "prompt": "hi", "logprobs": True}, 400, "logprobs"),
        ({"model": MODEL, "prompt": "hi", "top_logprobs": 2}, 400, "top_logprobs"),
        ({"model": MODEL, "prompt": 7}, 400, "prompt"),
        ({"model": MODEL, "prompt": [1, -2]}, 400, "prompt"),
        ({"model": MODEL, "prompt": [1, True]}, 400, "prompt"),
        ({"model": MODEL}, 400, "prompt"),
    ],
)
def test_bad_requests_get_their_status_and_an_openai_body(front_door, body, status, says):
    _, base = front_door
    got, _, answer = http_post(base + "/v1/completions", json.dumps(body).encode())
    assert got == status
    assert says in answer["error"]["message"]
    assert set(answer["error"]) == {"message", "type", "param", "code"}


# Prompts up to 64 tokens prefill on the decode worker (the router's
# KVROUTER_POLICY_LOCAL_PREFILL_MAX_TOKENS here); longer ones on the prefill
# worker, whose first token comes through the hand-off.
LOGPROB_PROMPTS = ["Hello, world!", "The quick brown fox jumps over the lazy dog. " * 3]


@pytest.mark.parametrize("prompt", LOGPROB_PROMPTS, ids=["one-worker", "prefill-decode"])
def test_completion_logprobs_are_the_engines(client, tokenizer, scored, prompt):
    tokens = tokenizer.encode(prompt)
    ids, want = scored(tokens, 6, 3)
    answer = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, logprobs=3, **GREEDY
    )
    got = answer.choices[0].logprobs
    texts = [tokenizer.token_texts.of(t)[0] for t in ids]
    assert got.tokens == texts
    assert got.token_logprobs == pytest.approx([w.logprob for w in want], abs=1e-4)
    assert got.text_offset == [sum(map(len, texts[:i])) for i in range(len(texts))]
    for top, w, text in zip(got.top_logprobs, want, texts, strict=True):
        # The chosen token first, then the most likely, as vLLM's.
        expected = {text: w.logprob}
        for t, lp in w.top:
            expected.setdefault(tokenizer.token_texts.of(t)[0], lp)
        assert list(top)[0] == text
        assert top == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("prompt", LOGPROB_PROMPTS, ids=["one-worker", "prefill-decode"])
def test_streamed_chat_logprobs_are_the_engines_with_each_tokens_bytes(
    client, tokenizer, scored, prompt
):
    messages = [{"role": "user", "content": prompt}]
    ids, want = scored(tokenizer.render_and_encode(messages).token_ids, 8, 2)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=8,
        stream=True,
        logprobs=True,
        top_logprobs=2,
        **GREEDY,
    )
    entries = [e for c in stream if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [bytes(e.bytes) for e in entries] == [tokenizer.token_texts.of(t)[1] for t in ids]
    assert [e.logprob for e in entries] == pytest.approx([w.logprob for w in want], abs=1e-4)
    for entry, w in zip(entries, want, strict=True):
        top = [(bytes(t.bytes), t.logprob) for t in entry.top_logprobs]
        assert [b for b, _ in top] == [tokenizer.token_texts.of(t)[1] for t, _ in w.top]
        assert [lp for _, lp in top] == pytest.approx([lp for _, lp in w.top], abs=1e-4)


def test_no_logprobs_unless_asked(client):
    answer = client.completions.create(model=MODEL, prompt="hi", max_tokens=2, **GREEDY)
    assert answer.choices[0].logprobs is None


def test_nulls_and_vllms_conventions_are_taken(client):
    answer = client.completions.create(
        model=MODEL,
        prompt="hi",
        max_tokens=2,
        extra_body={
            "temperature": None,
            "n": None,
            "stream": None,
            "top_k": -1,
            "seed": -5,
            "logprobs": False,
            "top_logprobs": 0,
        },
    )
    assert answer.usage.completion_tokens == 2
    assert answer.choices[0].logprobs is None


def test_unknown_paths_get_an_openai_body(front_door):
    _, base = front_door
    assert http_get(base + "/v1/nope")[0] == 404
    assert set(http_get(base + "/v1/nope")[1]["error"]) == {"message", "type", "param", "code"}


def test_a_client_gone_before_a_whole_answer_frees_the_workers(front_door):
    cluster, base = front_door
    body = json.dumps({"model": MODEL, "prompt": "long", "max_tokens": 400, "ignore_eos": True})
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n{body}".encode()
        )
        wait_until(lambda: not all_idle(cluster), what="the request to reach a worker")
    wait_until(lambda: all_idle(cluster), what="the abandoned request to leave the workers")


def test_bad_json_and_nan_are_400(front_door):
    _, base = front_door
    for body in (
        b"{not json",
        json.dumps({"model": MODEL, "prompt": "x", "temperature": math.nan}).encode(),
    ):
        status, _, answer = http_post(base + "/v1/chat/completions", body)
        assert status == 400, answer
        assert answer["error"]["type"] == "invalid_request_error"


def test_the_sdk_raises_its_own_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages="not a list")


def test_a_body_that_trickles_in_gets_408(front_door):
    _, base = front_door
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b'content-length: 100\r\n\r\n{"model": '
        )
        answer = _read_answer(sock)
    assert answer.startswith("HTTP/1.1 408"), answer
    assert f"within {BODY_TIMEOUT_S} s" in answer


def test_a_chat_without_max_tokens_runs_to_the_end_of_the_context(front_door, tokenizer):
    _, base = front_door
    messages = [{"role": "user", "content": "hi"}]
    body = {"model": MODEL, "messages": messages, "temperature": 0, "ignore_eos": True}
    status, _, answer = http_post(base + "/v1/chat/completions", json.dumps(body).encode())
    assert status == 200, answer
    usage = answer["usage"]
    assert usage["completion_tokens"] == min(1024, 2048 - usage["prompt_tokens"])


def test_a_body_over_the_limit_is_413_before_it_is_read(front_door):
    """Refused on its content-length alone: the client may still be sending
    it (and see its connection close), so only the headers are sent here."""
    _, base = front_door
    port = int(base.rsplit(":", 1)[1])
    size = MAX_PROMPT * 16 + (1 << 20) + 1
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"content-length: {size}\r\n\r\n".encode()
        )
        answer = _read_answer(sock)
    assert answer.startswith("HTTP/1.1 413"), answer
    assert "request body is over" in answer


def _read_answer(sock: socket.socket) -> str:
    """One whole answer, its headers and body (which may come in separate
    writes), read to its content-length."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return (head + b"\r\n\r\n" + body).decode()
