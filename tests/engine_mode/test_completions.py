"""The worker's vLLM-compatible `/v1/completions`, `/v1/models`, `/health`
and `/metrics`, through the official `openai` SDK and the sidecar's own
metrics reader, against a real worker process."""

from __future__ import annotations

import urllib.request

import openai
import pytest
from waiting import wait_until

from kvrouter.adapters.vllm.engine_load import read_engine_page

from .conftest import BLOCK_SIZE, MODEL, NUM_KV_BLOCKS

PROMPT = list(range(3, 3 + 2 * BLOCK_SIZE + 5))


@pytest.fixture
def client(engine_worker):
    with openai.OpenAI(base_url=f"{engine_worker.url}/v1", api_key="unused") as client:
        yield client


def metrics(worker) -> str:
    with urllib.request.urlopen(f"{worker.url}/metrics", timeout=10) as response:
        return response.read().decode()


def load(worker):
    return read_engine_page(metrics(worker))[0].load(NUM_KV_BLOCKS)


def test_a_streamed_completion_returns_the_engines_greedy_tokens_and_usage(client, reference):
    stream = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    chunks = list(stream)
    choices = [c.choices[0] for c in chunks if c.choices]
    assert choices[0].model_extra["prompt_token_ids"] == PROMPT
    assert all(c.model_extra["prompt_token_ids"] is None for c in choices[1:])
    tokens = [t for c in choices for t in c.model_extra["token_ids"]]
    assert tokens == reference(PROMPT, 6)
    assert [c.finish_reason for c in choices] == [None] * (len(choices) - 1) + ["length"]
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(PROMPT), 6)
    assert usage.prompt_tokens_details.cached_tokens is not None


@pytest.mark.parametrize("stream", [True, False])
def test_logprobs_name_tokens_by_id_as_vllm_does_and_are_the_engines(client, scored, stream):
    answer = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=4,
        temperature=0,
        logprobs=2,
        stream=stream,
        extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True},
    )
    choices = [c.choices[0] for c in answer if c.choices] if stream else answer.choices
    ids, want = scored(PROMPT, 4, 2)
    names = [f"token_id:{t}" for t in ids]
    assert [t for c in choices if c.logprobs for t in c.logprobs.tokens] == names
    got = [lp for c in choices if c.logprobs for lp in c.logprobs.token_logprobs]
    assert got == pytest.approx([w.logprob for w in want], abs=1e-4)
    tops = [top for c in choices if c.logprobs for top in c.logprobs.top_logprobs]
    for top, name, w in zip(tops, names, want, strict=True):
        # vLLM's order: the chosen token, then the most likely.
        assert list(top)[0] == name
        most_likely = {f"token_id:{t}": lp for t, lp in w.top}
        assert top == pytest.approx({name: w.logprob} | most_likely, abs=1e-4)


def test_a_whole_completion_counts_the_cached_prompt(client, reference):
    prompt = [[t + 100 for t in PROMPT]]
    answers = [
        client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=4,
            temperature=0,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
        for _ in range(2)
    ]
    for answer in answers:
        choice = answer.choices[0]
        assert choice.model_extra["token_ids"] == reference(prompt[0], 4)
        assert choice.model_extra["prompt_token_ids"] == prompt[0]
        assert choice.finish_reason == "length"
        assert answer.usage.total_tokens == len(PROMPT) + 4
    assert answers[0].usage.prompt_tokens_details.cached_tokens == 0
    # The second finds the first's full prompt blocks in the prefix cache.
    assert answers[1].usage.prompt_tokens_details.cached_tokens == 2 * BLOCK_SIZE


def test_a_client_that_goes_away_mid_stream_frees_its_blocks(client, engine_worker):
    before = metrics(engine_worker)
    stream = client.completions.create(
        model=MODEL,
        prompt=[t + 200 for t in PROMPT],
        max_tokens=1500,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for _, _chunk in zip(range(3), stream, strict=False):
        pass
    assert load(engine_worker).active_requests == 1
    stream.close()
    wait_until(lambda: load(engine_worker).active_requests == 0, what="the request to be aborted")
    assert load(engine_worker).active_decode_blocks == 0
    # Aborted, not run to its end: far fewer than its 1500 tokens were made.
    generated = _generated(metrics(engine_worker)) - _generated(before)
    assert 3 <= generated < 1500


def _generated(page: str) -> float:
    (line,) = [x for x in page.splitlines() if x.startswith("vllm:generation_tokens_total")]
    return float(line.rsplit(" ", 1)[1])


def test_models_health_and_refusals_read_as_vllms(client, engine_worker):
    (card,) = client.models.list().data
    assert (card.id, card.owned_by) == (MODEL, "vllm")
    with urllib.request.urlopen(f"{engine_worker.url}/health", timeout=10) as response:
        assert response.status == 200
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt=PROMPT, max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="return_tokens_as_token_ids"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, logprobs=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, seed="7")
    with pytest.raises(openai.BadRequestError, match="bootstrap_room"):
        client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=1,
            extra_body={"bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": -1},
        )
    with pytest.raises(openai.BadRequestError, match="cache_salt"):
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=1, extra_body={"cache_salt": "tenant-a"}
        )


def test_the_metrics_page_states_the_kv_capacity_as_vllms_does(engine_worker):
    """So that a sidecar in front of this engine registers its real capacity."""
    (reading,) = read_engine_page(metrics(engine_worker)).values()
    assert reading.capacity_tokens == NUM_KV_BLOCKS * BLOCK_SIZE


def test_a_stop_token_ends_the_completion_and_is_named(client, reference):
    greedy = reference(PROMPT, 6)
    stop = greedy[2]
    answer = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        extra_body={"return_token_ids": True, "stop_token_ids": [stop]},
    )
    choice = answer.choices[0]
    assert (choice.finish_reason, choice.model_extra["stop_reason"]) == ("stop", stop)
    assert choice.model_extra["token_ids"] == greedy[: greedy.index(stop) + 1]
