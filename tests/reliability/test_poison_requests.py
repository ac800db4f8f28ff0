"""Requests that break workers, through a real router and two real workers
(each serving a tiny model on its own event loop): a failure the request
caused is not carried to the other worker, and a request that keeps
failing workers is not sent again to a worker it failed twice. The faults
are injected into the workers' models, keyed on one prompt token."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from threaded_worker import started_workers
from waiting import wait_until

from kvrouter.client import RouterError, Unavailable
from kvrouter.client.generate import GenerateClient
from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint

# A prompt holding this token is the poison; the others do not.
POISON = 2
PROMPT = [5, 9, 14, POISON, 30, 41]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"), "llama", seed=5)


@pytest.fixture
def start_worker(tiny_model):
    yield from started_workers(str(tiny_model), num_kv_blocks=64)


@pytest.fixture
def cluster(start_router, start_worker):
    """A router and two workers that registered with it."""
    router = start_router()
    workers = [start_worker(router=router.target) for _ in range(2)]
    wait_until(
        lambda: sum(w.routable for w in router.client.list_workers()) == 2,
        what="both workers to be routable",
    )
    return router, workers


def inject(worker, fault) -> list[int]:
    """Runs `fault(embeddings, poisoned rows)` in the worker's model for each
    batch holding POISON; returns a list that counts those batches."""
    seen: list[int] = []
    embed = worker.server.engine_loop.engine.runner.model.model.embed_tokens

    def hook(module, inputs, output):
        rows = inputs[0] == POISON
        if bool(rows.any()):
            seen.append(1)
            return fault(output, rows)
        return None

    embed.register_forward_hook(hook)
    return seen


def generate(target: str, tokens: list[int], **sampling):
    async def run():
        async with GenerateClient(target, timeout=30.0) as client:
            return await client.generate(tokens, max_tokens=4, ignore_eos=True, **sampling)

    return asyncio.run(run())


def test_a_failure_the_request_caused_is_not_retried(cluster):
    router, workers = cluster

    def nan_logits(output, rows):
        return output.masked_fill(rows.unsqueeze(-1), float("nan"))

    seen = [inject(w, nan_logits) for w in workers]
    with pytest.raises(RouterError) as e:
        generate(router.target, PROMPT, temperature=1.0)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "not finite" in e.value.message
    assert sum(map(len, seen)) == 1  # one worker tried it, and only once
    assert len(generate(router.target, [5, 9, 14, 30]).token_ids) == 4


def test_a_worker_that_failed_a_request_twice_is_not_sent_it_again(cluster):
    router, workers = cluster

    def crash(output, rows):
        raise RuntimeError("injected fault")

    seen = [inject(w, crash) for w in workers]
    for _ in range(2):
        with pytest.raises(Unavailable):
            generate(router.target, PROMPT)
    assert [len(s) for s in seen] == [2, 2]
    with pytest.raises(Unavailable, match="failed this request before"):
        generate(router.target, PROMPT)
    assert [len(s) for s in seen] == [2, 2]
    # The workers still serve other requests.
    assert len(generate(router.target, [5, 9, 14, 30]).token_ids) == 4
