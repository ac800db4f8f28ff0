"""KV hand-off: a decode worker that imports a prefill worker's blocks
continues exactly as one worker doing both would."""

import pytest
import torch

from kvrouter._core import chain_hashes, local_block_hashes
from kvrouter.engine import EngineConfig, KvBlocks, LLMEngine, SamplingParams

from .recording_sink import RecordingSink

BLOCK_SIZE = 4
PROMPT = [11, 4, 93, 120, 7, 7, 250, 3, 18, 64, 65, 66, 200, 1, 9, 30, 31, 32, 77, 5, 6, 88]


def make_engine(checkpoint, sink=None, **overrides):
    settings = dict(model=checkpoint, block_size=BLOCK_SIZE, num_kv_blocks=32)
    settings.update(overrides)
    return LLMEngine(EngineConfig(**settings), event_sink=sink)


def prefill(engine, prompt):
    """What a prefill worker does: run the prompt, keep its blocks pinned."""
    [first] = engine.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True))
    block_ids = engine.pin_blocks(engine.block_ids(prompt))
    return first.token_ids[0], block_ids


def test_import_then_decode_equals_aggregated_generation(tiny_qwen2):
    aggregated = make_engine(tiny_qwen2).generate(
        [PROMPT], SamplingParams(max_tokens=8, ignore_eos=True)
    )[0]

    prefill_worker = make_engine(tiny_qwen2)
    first_token, block_ids = prefill(prefill_worker, PROMPT)
    exported = prefill_worker.export_blocks(block_ids)
    prefill_worker.unpin_blocks(block_ids)
    # Over the wire and back, as the worker service will carry it.
    received = KvBlocks.from_bytes(block_ids, exported.to_bytes(), exported.layout)

    sink = RecordingSink(BLOCK_SIZE)
    decode_worker = make_engine(tiny_qwen2, sink=sink)
    continuation = PROMPT + [first_token]
    assert decode_worker.import_blocks(continuation, received) == len(block_ids)
    [decoded] = decode_worker.generate(
        [continuation], SamplingParams(max_tokens=7, ignore_eos=True)
    )

    assert [first_token] + decoded.token_ids == aggregated.token_ids
    # Only the partial tail was computed on the decode worker.
    assert decoded.num_cached_tokens == len(block_ids) * BLOCK_SIZE
    # The imported blocks were announced like computed ones, chained from the start.
    _, parent, stored_ids, tokens = sink.events[0]
    assert parent is None and stored_ids == block_ids
    assert chain_hashes(local_block_hashes(tokens, block_size=BLOCK_SIZE), None) == block_ids


def test_only_missing_blocks_travel(tiny_qwen2):
    prefill_worker = make_engine(tiny_qwen2)
    decode_worker = make_engine(tiny_qwen2)
    # The decode worker already holds the first 2 blocks from an earlier request.
    decode_worker.generate([PROMPT[:9]], SamplingParams(max_tokens=1, ignore_eos=True))

    first_token, block_ids = prefill(prefill_worker, PROMPT)
    held = decode_worker.cached_block_ids(PROMPT)
    assert held == block_ids[:2]
    missing = block_ids[len(held) :]
    imported = decode_worker.import_blocks(PROMPT, prefill_worker.export_blocks(missing))
    assert imported == len(missing)
    assert decode_worker.cached_block_ids(PROMPT) == block_ids


def test_blocks_from_another_namespace_are_refused(tiny_qwen2):
    prefill_worker = make_engine(tiny_qwen2, namespace="model-a")
    decode_worker = make_engine(tiny_qwen2, namespace="model-b")
    _, block_ids = prefill(prefill_worker, PROMPT)
    with pytest.raises(ValueError, match="do not match"):
        decode_worker.import_blocks(PROMPT, prefill_worker.export_blocks(block_ids))
    assert decode_worker.block_manager.num_free_blocks == 32
    assert decode_worker.cached_block_ids(PROMPT) == []


def test_blocks_with_another_layout_are_refused(tiny_qwen2):
    prefill_worker = make_engine(tiny_qwen2)
    decode_worker = make_engine(tiny_qwen2, dtype=torch.float16)
    _, block_ids = prefill(prefill_worker, PROMPT)
    with pytest.raises(ValueError, match="layout"):
        decode_worker.import_blocks(PROMPT, prefill_worker.export_blocks(block_ids))


def test_exporting_an_unknown_block_fails_clearly(tiny_qwen2):
    with pytest.raises(KeyError, match="not in the cache"):
        make_engine(tiny_qwen2).export_blocks([12345])


def test_truncated_payload_is_refused(tiny_qwen2):
    worker = make_engine(tiny_qwen2)
    _, block_ids = prefill(worker, PROMPT)
    exported = worker.export_blocks(block_ids)
    with pytest.raises(ValueError, match="bytes"):
        KvBlocks.from_bytes(block_ids, exported.to_bytes()[:-1], exported.layout)
