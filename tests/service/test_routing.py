"""Registration, then KV events, then routing: the router picks the worker
that owns the prompt's prefix, over each client and call style."""

from __future__ import annotations

import asyncio

from kvrouter.client import AsyncRouterClient, InvalidArgument

from .helpers import BLOCK, prompt


def publish_prefix(router, worker_id: int, tokens: list[int]) -> None:
    publisher = router.publisher(worker_id)
    blocks = len(tokens) // BLOCK
    block_ids = [worker_id * 10_000 + i for i in range(blocks)]
    publisher.stored(None, block_ids, tokens)
    assert publisher.flush(timeout=10)


def test_route_picks_the_worker_that_owns_the_prefix(router):
    for worker_id in (1, 2, 3):
        router.worker(worker_id)
    cached = prompt(seed=7, blocks=32)
    publish_prefix(router, 2, cached)
    client = router.client()

    result = client.route(cached + [1, 2, 3], namespace="", request_id="req-1", explain=True)

    assert result.request_id == "req-1"
    assert result.decode_worker == 2
    assert result.decode_address == "w2:1"
    assert result.num_blocks == 32
    assert "worker 2" in result.explanation.reason
    overlaps = {c.worker_id: c.overlap for c in result.explanation.decode_candidates}
    assert overlaps == {1: 0, 2: 32, 3: 0}


def test_unexplained_answer_carries_only_the_chosen_candidate(router):
    router.worker(1)
    router.worker(2)
    result = router.client().route(prompt(seed=1, blocks=4))
    assert [c.worker_id for c in result.explanation.decode_candidates] == [result.decode_worker]
    assert result.request_id  # assigned by the router


def test_route_many_answers_in_order_with_errors_in_place(router):
    router.worker(1)
    router.worker(2)
    publish_prefix(router, 1, prompt(seed=3, blocks=8))
    publish_prefix(router, 2, prompt(seed=4, blocks=8))
    client = router.client()

    results = client.route_many(
        [prompt(seed=3, blocks=8), [], prompt(seed=4, blocks=8)],
        request_ids=["a", "b", "c"],
        return_exceptions=True,
    )

    assert results[0].decode_worker == 1
    assert isinstance(results[1], InvalidArgument)
    assert results[2].decode_worker == 2
    assert [r.request_id for r in (results[0], results[2])] == ["a", "c"]


def test_lifecycle_reports_release_the_booking(router):
    router.worker(1)
    client = router.client()
    first = client.route(prompt(seed=5, blocks=2), request_id="r")
    client.prefill_done(first.request_id)
    client.finished(first.request_id)
    # Finished: the same request id may be routed again.
    assert client.route(prompt(seed=5, blocks=2), request_id="r").decode_worker == 1
    client.cancelled("r")


def test_async_client_routes_and_lists_workers(router):
    router.worker(4, role="decode")
    publish_prefix(router, 4, prompt(seed=9, blocks=4))

    async def scenario():
        async with AsyncRouterClient(router.target) as client:
            one = await client.route(prompt(seed=9, blocks=4), request_id="x")
            many = await client.route_many([prompt(seed=9, blocks=4)] * 3)
            await client.finished(one.request_id)
            return one, many, await client.list_workers()

    one, many, workers = asyncio.run(scenario())
    assert one.decode_worker == 4
    assert [r.decode_worker for r in many] == [4, 4, 4]
    assert len({r.request_id for r in many}) == 3
    (info,) = workers
    assert (info.worker_id, info.role, info.index_blocks, info.routable) == (4, "decode", 4, True)
