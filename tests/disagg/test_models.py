"""Two models behind one router, each with its own prefill and decode worker
(`kvrouter worker --served-model-name`), every process started for real on
127.0.0.1: Route and proxied Generate never cross from one model's workers
to the other's, each model reuses its own cached prefixes only, and a model
no worker serves is NOT_FOUND."""

from __future__ import annotations

import asyncio

import pytest
from waiting import wait_until

from kvrouter.client import NotFound, RouterClient, Unavailable
from kvrouter.client.generate import GenerateClient

from .conftest import start_cluster
from .helpers import BLOCK, all_idle, prompt

ROLES = ["prefill", "decode", "prefill", "decode"]
MODELS = ["llama", "llama", "qwen", "qwen"]
POOLS = {"llama": {1, 2}, "qwen": {3, 4}}
REQUESTS = 20


@pytest.fixture(scope="module")
def cluster(tiny_model, tmp_path_factory):
    cluster = start_cluster(tiny_model, tmp_path_factory, {}, [], roles=ROLES, models=MODELS)
    yield cluster
    cluster.stop()


@pytest.fixture
def idle(cluster):
    yield cluster
    wait_until(lambda: all_idle(cluster), what="every worker to be idle")


def overlaps(target: str, tokens: list[int], model: str) -> dict[int, int]:
    """Blocks of `tokens` the router's index holds, per worker of `model`."""
    with RouterClient(target) as router:
        result = router.route(tokens, model=model, explain=True)
        router.cancelled(result.request_id)
    candidates = result.explanation.decode_candidates + result.explanation.prefill_candidates
    return {c.worker_id: c.overlap for c in candidates}


def generate_many(target: str, model: str, prompts: list[list[int]]):
    async def run():
        async with GenerateClient(target, model=model, timeout=120.0) as client:
            return await asyncio.gather(
                *(client.generate(p, max_tokens=2, ignore_eos=True) for p in prompts)
            )

    return asyncio.run(run())


def test_each_worker_lists_the_model_it_was_started_with(cluster):
    assert {w.worker_id: w.model for w in cluster.list_workers()} == dict(
        enumerate(MODELS, start=1)
    )


@pytest.mark.parametrize("model", sorted(POOLS))
def test_route_never_crosses_to_another_models_workers(idle, model):
    # Long enough to split: the prefill goes to the model's prefill worker.
    prompts = [prompt(100 + i, 200) for i in range(REQUESTS)]
    with RouterClient(idle.target) as router:
        results = [router.route(p, model=model) for p in prompts]
        results += router.route_many(prompts, model=model)
        for r in results:
            router.cancelled(r.request_id)
    chosen = {r.decode_worker for r in results} | {r.prefill_worker for r in results}
    assert chosen - {None} <= POOLS[model], chosen


@pytest.mark.parametrize("model", sorted(POOLS))
def test_proxied_generate_never_crosses_to_another_models_workers(idle, model):
    prompts = [prompt(200 + i, 40 + 8 * i) for i in range(REQUESTS)]
    done = generate_many(idle.target, model, prompts)
    served = {g.decode_worker for g in done} | {g.prefill_worker for g in done}
    assert served - {None} <= POOLS[model], served
    assert all(len(g.token_ids) == 2 for g in done)


def test_a_model_no_worker_serves_is_not_found(idle):
    with RouterClient(idle.target) as router:
        with pytest.raises(NotFound, match='"mistral"'):
            router.route(prompt(1, 40), model="mistral")
        with pytest.raises(Unavailable):
            router.route(prompt(1, 40))  # no worker serves the unnamed model
    with pytest.raises(NotFound, match='"mistral"'):
        generate_many(idle.target, "mistral", [prompt(1, 40)])


def test_a_prefix_is_reused_within_its_model_and_never_across_models(idle):
    tokens = prompt(7, 300)
    blocks = len(tokens) // BLOCK
    [first] = generate_many(idle.target, "llama", [tokens])
    wait_until(
        lambda: max(overlaps(idle.target, tokens, "llama").values()) >= blocks,
        what="llama's blocks in the router's index",
    )
    assert set(overlaps(idle.target, tokens, "qwen").values()) == {0}, "no hit across models"
    [again] = generate_many(idle.target, "llama", [tokens])
    assert again.stats.cached_tokens >= blocks * BLOCK
    assert again.decode_worker == first.decode_worker

    [other] = generate_many(idle.target, "qwen", [tokens])
    assert other.decode_worker in POOLS["qwen"]
    assert other.stats.cached_tokens == 0, "qwen computes the same tokens afresh"
    assert first.token_ids == other.token_ids, "the same checkpoint, so the same tokens"
