"""The worker's KV events on vLLM's ZMQ wire, decoded by kvrouter's own
vLLM adapter: live from the PUB socket and again from the replay socket."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import msgspec
import zmq
import zmq.asyncio

from kvrouter.adapters.vllm.replay import fetch_replay
from kvrouter.adapters.vllm.wire import BlockRemoved, BlockStored, decode_batch
from kvrouter.events import Cleared, Removed, Stored, Tier
from kvrouter.worker.engine_mode.kv_events import ZmqEventPublisher

from .conftest import BLOCK_SIZE

STORED_KEYS = {
    "type",
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
}


def complete(worker, prompt: list[int]) -> None:
    body = json.dumps({"prompt": prompt, "max_tokens": 1, "temperature": 0}).encode()
    request = urllib.request.Request(f"{worker.url}/v1/completions", data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def replay(endpoint: str, start_seq: int) -> tuple[dict[int, bytes], bool]:
    async def ask():
        ctx = zmq.asyncio.Context()
        try:
            return await fetch_replay(ctx, endpoint, start_seq, idle_timeout_s=10.0)
        finally:
            ctx.destroy(linger=0)

    return asyncio.run(ask())


def test_a_completions_blocks_are_published_and_replayed_as_vllm_sends_them(engine_worker):
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.subscribe(b"")
    sub.connect(engine_worker.kv_events)
    try:
        # A subscriber misses what is sent before it is connected: new prompts
        # until one's events arrive.
        attempt = 0
        while True:
            prompt = [1 + attempt] + list(range(40, 40 + 2 * BLOCK_SIZE + 2))
            complete(engine_worker, prompt)
            attempt += 1
            if sub.poll(2000):
                break
        topic, seq_bytes, payload = sub.recv_multipart()
    finally:
        ctx.destroy(linger=0)
    assert topic == b""
    seq = int.from_bytes(seq_bytes, "big")
    raw = msgspec.msgpack.decode(payload)
    assert isinstance(raw, list) and raw[2] == 0
    (stored,) = [e for e in raw[1] if e["type"] == "BlockStored"]
    assert set(stored) == STORED_KEYS
    assert (stored["medium"], stored["lora_id"], stored["parent_block_hash"]) == ("GPU", None, None)
    batch = decode_batch(payload)
    (event,) = [e for e in batch.events if isinstance(e, BlockStored)]
    assert event.block_size == BLOCK_SIZE
    assert event.token_ids == prompt[: 2 * BLOCK_SIZE]
    assert len(event.block_hashes) == 2

    batches, answered = replay(engine_worker.kv_replay, 0)
    assert answered
    assert sorted(batches) == list(range(len(batches)))
    assert batches[seq] == payload


def test_removals_clears_and_a_bounded_replay_buffer():
    publisher = ZmqEventPublisher(
        "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", block_size=4, buffer_steps=2
    )
    try:
        publisher.emit([Stored([7, 8], range(8), tier=Tier.HOST)])
        publisher.emit([Removed([7], tier=Tier.HOST)])
        publisher.emit([Cleared()])
        # The publisher's thread sends and buffers them in turn: asked before
        # it has buffered the last one, the replay would hold the first two.
        batches, answered = replay(publisher.replay_endpoint, 0)
        while 2 not in batches:
            batches, answered = replay(publisher.replay_endpoint, 0)
    finally:
        publisher.close()
    assert answered
    # The buffer keeps the last two batches only.
    assert sorted(batches) == [1, 2]
    (removed,) = decode_batch(batches[1]).events
    assert isinstance(removed, BlockRemoved)
    assert (removed.block_hashes, removed.medium) == ([7], "CPU")
    assert type(decode_batch(batches[2]).events[0]).__name__ == "AllBlocksCleared"
