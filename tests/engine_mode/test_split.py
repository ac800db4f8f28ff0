"""The router as vLLM's P/D proxy and as SGLang's bootstrap load balancer,
end to end: a real `kvrouter serve` with its front door, and two real
`kvrouter worker` processes in their engine-compatible mode, a prefill and
a decode engine, registered as OpenAI engines that speak vLLM's
kv_transfer_params (KV_TRANSFER_VLLM) or SGLang's bootstrap
(KV_TRANSFER_SGLANG), each test once per protocol. A split request
prefills on P (which pins the prompt's blocks), D fetches the blocks over
P's gRPC FetchBlocks and decodes: greedy outputs equal one engine's. P
killed before or during its prefill: the request is served whole on D,
same tokens. D killed mid-stream: a clean error."""

from __future__ import annotations

import os
import re
import signal
import threading
import urllib.request

import grpc
import openai
import pytest
from serve_process import ServeProcess
from waiting import wait_until

from kvrouter.client import RouterClient, WorkerRegistration
from kvrouter.demo.cluster import free_port
from kvrouter.frontend import ModelTokenizer
from kvrouter.proto_gen import worker_pb2 as wpb
from kvrouter.proto_gen import worker_pb2_grpc

from .conftest import BLOCK_SIZE, MODEL, NUM_KV_BLOCKS, start_engine_worker

PROMPT = list(range(20, 20 + 3 * BLOCK_SIZE + 5))
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def router(tiny_model):
    port = free_port()
    process = ServeProcess(
        "--block-size",
        str(BLOCK_SIZE),
        "--http-listen",
        f"127.0.0.1:{port}",
        "--served-models",
        f"{MODEL}={tiny_model}",
        # Every prompt of more than a block is worth a prefill engine.
        env={"KVROUTER_POLICY_LOCAL_PREFILL_MAX_TOKENS": str(BLOCK_SIZE)},
    )
    process.base = f"http://127.0.0.1:{port}/v1"
    yield process
    process.kill()


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def kv_transfer(request) -> str:
    return request.param


def join(router, worker, role: str, kv_transfer: str) -> WorkerRegistration:
    """Registers an engine as the sidecar would, from this process: its
    heartbeats go on even after the engine is killed, as a sidecar's do
    until its probes notice. A prefill engine's SGLang bootstrap is on its
    HTTP port."""
    bootstrap = int(worker.url.rsplit(":", 1)[1]) if role == "prefill" else 0
    registration = WorkerRegistration(
        router.target,
        role=role,
        capacity_blocks=NUM_KV_BLOCKS,
        address=worker.url,
        block_size=BLOCK_SIZE,
        model=MODEL,
        protocol="openai",
        kv_transfer=kv_transfer,
        bootstrap_port=bootstrap if kv_transfer == "sglang" else 0,
    )
    registration.start_background()
    return registration


@pytest.fixture(scope="module")
def decode(router, tiny_model, kv_transfer):
    worker = start_engine_worker(tiny_model, "--role", "decode")
    registration = join(router, worker, "decode", kv_transfer)
    yield worker
    registration.stop_background()
    worker.kill()


@pytest.fixture
def prefill(router, tiny_model, decode, kv_transfer):
    worker = start_engine_worker(tiny_model, "--role", "prefill", "--fetch-timeout-s", "3")
    registration = join(router, worker, "prefill", kv_transfer)
    wait_until(lambda: split_decision(router, PROMPT), what="a split decision")
    yield worker
    registration.stop_background()
    worker.kill()
    wait_until(lambda: not booked(router), what="every booking to be closed")


@pytest.fixture
def client(router):
    with openai.OpenAI(base_url=router.base, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def split_decision(router, prompt) -> bool:
    with RouterClient(router.target) as probe:
        result = probe.route(prompt, model=MODEL)
        probe.cancelled(result.request_id)
    return result.disaggregated


def booked(router) -> int:
    with RouterClient(router.target) as probe:
        result = probe.route(PROMPT, model=MODEL, explain=True)
        probe.cancelled(result.request_id)
    return sum(c.active_requests for c in result.explanation.decode_candidates)


def counter(worker, name: str) -> float:
    with urllib.request.urlopen(f"{worker.url}/metrics", timeout=10) as response:
        page = response.read().decode()
    return sum(float(v) for v in re.findall(rf"^{name}_total{{[^}}]*}} (\S+)$", page, re.M))


def leases(worker) -> int:
    with grpc.insecure_channel(worker.address) as channel:
        status = worker_pb2_grpc.WorkerStub(channel).Status(wpb.StatusRequest(), timeout=5)
    return status.leases


@pytest.fixture(scope="module")
def expected(tiny_model, reference):
    """The text of one engine's greedy tokens."""
    tokenizer = ModelTokenizer.from_dir(tiny_model)
    return lambda prompt, max_tokens: tokenizer.decode(reference(prompt, max_tokens))


def complete(client, prompt, max_tokens: int) -> str:
    answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, **GREEDY)
    return answer.choices[0].text


def greedy_on(engine, prompt: list[int], split_fields: dict) -> list[int]:
    """8 greedy tokens of `prompt`, asked of `engine` itself with a split
    protocol's fields, as the router would send them."""
    with openai.OpenAI(base_url=f"{engine.url}/v1", api_key="unused") as direct:
        answer = direct.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=8,
            temperature=0,
            extra_body={**split_fields, "ignore_eos": True, "return_token_ids": True},
        )
    return answer.choices[0].model_extra["token_ids"]


def test_a_split_request_decodes_from_the_prefill_engines_blocks(client, prefill, decode, expected):
    generated = counter(prefill, "vllm:generation_tokens")
    fetched = len(decode.logged("hand-off fetched"))
    assert complete(client, PROMPT, 8) == expected(PROMPT, 8)
    assert counter(prefill, "vllm:generation_tokens") - generated == 1, "P ran more than a prefill"
    (handoff,) = decode.logged("hand-off fetched")[fetched:]
    assert handoff["blocks_transferred"] == len(PROMPT) // BLOCK_SIZE
    assert handoff["source"] == prefill.address
    wait_until(lambda: leases(prefill) == 0, what="D to release P's hand-off")

    # A prompt sharing its first two blocks: D fetches only the third.
    shared = PROMPT[: 2 * BLOCK_SIZE] + [t + 100 for t in PROMPT[2 * BLOCK_SIZE :]]
    assert complete(client, shared, 8) == expected(shared, 8)
    handoff = decode.logged("hand-off fetched")[-1]
    assert (handoff["blocks_reused"], handoff["blocks_transferred"]) == (2, 1)

    # Streamed, through the same split, the same tokens.
    prompt = [t + 1 for t in PROMPT]
    stream = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, stream=True, **GREEDY
    )
    text = "".join(c.choices[0].text for c in stream if c.choices)
    assert text == expected(prompt, 6)
    assert len(decode.logged("hand-off fetched")) == fetched + 3


FALLBACK = "the prefill engine failed; the decode engine serves the request whole"


def test_a_prefill_engine_killed_before_the_request_is_passed_over(
    router, client, prefill, expected
):
    fallbacks = len(router.logged(FALLBACK))
    prefill.kill()
    prompt = [t + 2 for t in PROMPT]
    assert complete(client, prompt, 8) == expected(prompt, 8)
    assert len(router.logged(FALLBACK)) == fallbacks + 1


def test_a_prefill_engine_killed_while_it_holds_the_request_is_passed_over(
    router, client, prefill, expected
):
    fallbacks = len(router.logged(FALLBACK))
    prompt = [t + 3 for t in PROMPT]
    # Stopped, it still accepts the router's connection; killed, it resets it.
    os.kill(prefill.proc.pid, signal.SIGSTOP)
    answer: list = []
    request = threading.Thread(target=lambda: answer.append(complete(client, prompt, 8)))
    request.start()
    wait_until(lambda: booked(router) == 1, what="the request to be routed")
    prefill.kill()
    request.join(60)
    assert answer == [expected(prompt, 8)]
    assert len(router.logged(FALLBACK)) == fallbacks + 1


def test_a_hand_off_whose_lease_is_gone_is_prefilled_on_the_decode_engine(
    prefill, decode, reference, kv_transfer
):
    if kv_transfer != "vllm":
        pytest.skip("vLLM's kv_transfer_params, sent by hand")
    prompt = [t + 5 for t in PROMPT]
    with openai.OpenAI(base_url=f"{prefill.url}/v1", api_key="unused") as engine:
        prefilled = engine.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=1,
            extra_body={"kv_transfer_params": {"do_remote_decode": True}},
        )
    params = prefilled.model_extra["kv_transfer_params"]
    assert params["remote_block_ids"] and params["remote_port"]
    with grpc.insecure_channel(prefill.address) as channel:
        worker_pb2_grpc.WorkerStub(channel).Release(
            wpb.ReleaseRequest(request_id=params["remote_request_id"]), timeout=5
        )
    failed = len(decode.logged("could not fetch the hand-off; prefilling the rest"))
    assert greedy_on(decode, prompt, {"kv_transfer_params": params}) == reference(prompt, 8)
    assert len(decode.logged("could not fetch the hand-off; prefilling the rest")) == failed + 1


def test_a_room_the_prefill_engine_never_prefilled_is_prefilled_on_the_decode_engine(
    prefill, decode, reference, kv_transfer
):
    if kv_transfer != "sglang":
        pytest.skip("SGLang's bootstrap, sent by hand")
    prompt = [t + 6 for t in PROMPT]
    host, port = prefill.url.removeprefix("http://").rsplit(":", 1)
    unused = len(decode.logged("no hand-off from the prefill engine's bootstrap; prefilling"))
    # P's bootstrap answers 404 for a room it never saw, after its wait (its
    # --fetch-timeout-s).
    room = {"bootstrap_host": host, "bootstrap_port": int(port), "bootstrap_room": 12345}
    assert greedy_on(decode, prompt, room) == reference(prompt, 8)
    logged = decode.logged("no hand-off from the prefill engine's bootstrap; prefilling")
    assert len(logged) == unused + 1


def test_a_decode_engine_killed_mid_stream_ends_the_answer_with_an_error(
    router, client, prefill, decode
):
    # Last in the module: the decode engine does not come back.
    stream = client.completions.create(
        model=MODEL, prompt=[t + 4 for t in PROMPT], max_tokens=1500, stream=True, **GREEDY
    )
    chunks = iter(stream)
    next(chunks)
    decode.kill()
    with pytest.raises(openai.APIError, match="failed after"):
        for _ in chunks:
            pass
