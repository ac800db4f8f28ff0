"""Given `--router` as well, a worker in the engine-compatible mode also
joins the router itself, and its KV events go both to the router over gRPC
and to vLLM's ZMQ socket."""

from __future__ import annotations

from serve_process import ServeProcess
from waiting import wait_until

from kvrouter.adapters.vllm.wire import BlockStored, decode_batch
from kvrouter.client import RouterClient

from .conftest import BLOCK_SIZE, MODEL, start_engine_worker
from .test_kv_events import complete, replay

PROMPT = list(range(20, 20 + 2 * BLOCK_SIZE))


def test_a_worker_given_a_router_registers_and_publishes_to_it_too(tiny_model):
    router = ServeProcess("--block-size", str(BLOCK_SIZE))
    worker = start_engine_worker(tiny_model, "--router", router.target)
    try:
        with RouterClient(router.target) as client:
            (registered,) = client.list_workers()
            assert registered.model == MODEL
            complete(worker, PROMPT)
            wait_until(
                lambda: client.list_workers()[0].index_blocks >= 2,
                what="the router's index to hold the prompt's blocks",
            )
        batches, answered = replay(worker.kv_replay, 0)
        stored = [
            e
            for p in batches.values()
            for e in decode_batch(p).events
            if isinstance(e, BlockStored)
        ]
        assert answered and stored[0].token_ids == PROMPT
    finally:
        worker.kill()
        router.kill()
