"""A 2P+2D pool as docs/deployment.md ("Putting kvrouter in front of
vLLM") sets one up, with engine-mode workers standing in for vLLM: a real
`kvrouter serve` with its front door, four `kvrouter worker
--vllm-http-listen` processes (two prefill, two decode) and a real
`kvrouter sidecar` whose engines.toml registers them with
`kv_transfer = "vllm"`. Every answer equals one engine's greedy output,
and each went through a hand-off; log probabilities asked of the front
door are the engine's, read from D's stream."""

from __future__ import annotations

import subprocess
import sys

import openai
import pytest
from serve_process import ServeProcess
from waiting import wait_until

from kvrouter.client import RouterClient
from kvrouter.demo.cluster import free_port
from kvrouter.frontend import ModelTokenizer

from .conftest import BLOCK_SIZE, MODEL, NUM_KV_BLOCKS, start_engine_worker

ROLES = ("prefill", "prefill", "decode", "decode")


def entry(name: str, worker, role: str) -> str:
    return f"""[[engines]]
name = "{name}"
endpoint = "{worker.kv_events}"
replay_endpoint = "{worker.kv_replay}"
address = "{worker.url}"
model = "{MODEL}"
role = "{role}"
kv_transfer = "vllm"
capacity_blocks = {NUM_KV_BLOCKS}
probe_interval_s = 0.2
"""


@pytest.fixture(scope="module")
def pool(tiny_model, tmp_path_factory):
    port = free_port()
    router = ServeProcess(
        "--block-size",
        str(BLOCK_SIZE),
        "--http-listen",
        f"127.0.0.1:{port}",
        "--served-models",
        f"{MODEL}={tiny_model}",
        env={"KVROUTER_POLICY_LOCAL_PREFILL_MAX_TOKENS": str(BLOCK_SIZE)},
    )
    workers = [start_engine_worker(tiny_model, "--role", role) for role in ROLES]
    engines = tmp_path_factory.mktemp("pool") / "engines.toml"
    engines.write_text(
        "\n".join(
            entry(f"{role}-{i}", w, role)
            for i, (w, role) in enumerate(zip(workers, ROLES, strict=True))
        )
    )
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "kvrouter.cli", "sidecar", str(engines), "--router", router.target],
        stderr=subprocess.DEVNULL,
    )
    yield router, f"http://127.0.0.1:{port}/v1", workers
    sidecar.kill()
    sidecar.wait()
    for worker in workers:
        worker.kill()
    router.kill()


def test_a_2p_2d_pool_behind_the_sidecar_serves_every_request_split(pool, tiny_model, reference):
    router, base, workers = pool

    def registered() -> dict:
        with RouterClient(router.target) as client:
            return {w.address: (w.role, w.kv_transfer) for w in client.list_workers()}

    wait_until(lambda: len(registered()) == 4, what="the sidecar to register the pool")
    assert registered() == {w.url: (role, "vllm") for w, role in zip(workers, ROLES, strict=True)}

    tokenizer = ModelTokenizer.from_dir(tiny_model)
    prompts = [[(t * 7 + i) % 200 + 3 for t in range(3 * BLOCK_SIZE + 2)] for i in range(6)]
    with openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60) as client:
        for prompt in prompts:
            answer = client.completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=6,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            assert answer.choices[0].text == tokenizer.decode(reference(prompt, 6))
    decoders = workers[2:]
    handoffs = [r for w in decoders for r in w.logged("hand-off fetched")]
    assert len(handoffs) == len(prompts)
    assert {h["source"] for h in handoffs} <= {w.address for w in workers[:2]}


def test_log_probabilities_come_through_the_split_as_the_engines(pool, tiny_model, scored):
    router, base, workers = pool
    tokenizer = ModelTokenizer.from_dir(tiny_model)
    prompt = [(t * 11) % 200 + 3 for t in range(3 * BLOCK_SIZE + 2)]
    ids, want = scored(prompt, 5, 3)
    with openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60) as client:
        wait_until(lambda: _routable(client), what="the pool to be routable")
        stream = client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=5,
            temperature=0,
            logprobs=3,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks = [c.choices[0].logprobs for c in stream if c.choices and c.choices[0].logprobs]
    tokens = [t for lp in chunks for t in lp.tokens]
    assert tokens == [tokenizer.token_texts.of(t)[0] for t in ids]
    got = [v for lp in chunks for v in lp.token_logprobs]
    assert got == pytest.approx([w.logprob for w in want], abs=1e-4)
    tops = [top for lp in chunks for top in lp.top_logprobs]
    for top, text, w in zip(tops, tokens, want, strict=True):
        expected = {text: w.logprob}
        for t, lp in w.top:
            expected.setdefault(tokenizer.token_texts.of(t)[0], lp)
        assert top == pytest.approx(expected, abs=1e-4)


def _routable(client) -> bool:
    return any(m.id == MODEL for m in client.models.list().data)
