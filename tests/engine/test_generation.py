"""End-to-end generation: the cache, batching and backend choices change how
the work is done, never the tokens produced."""

import pytest
import torch

from kvrouter._core import chain_hashes, local_block_hashes
from kvrouter.engine import EngineConfig, LLMEngine, SamplingParams

from .recording_sink import RecordingSink

GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)
SHARED = [7, 3, 99, 12, 45, 200, 31, 8, 8, 17, 64, 150, 2, 90, 33, 71, 5, 120, 44, 9]
PROMPTS = [
    SHARED + [1, 2, 3],
    SHARED + [4, 5, 6, 7, 8, 9, 10, 11, 12],
    SHARED[:9],
    [250, 251, 252],
]


def make_engine(checkpoint, sink=None, **overrides):
    settings = dict(model=checkpoint, block_size=4, num_kv_blocks=64, max_num_batched_tokens=256)
    settings.update(overrides)
    return LLMEngine(EngineConfig(**settings), event_sink=sink)


def tokens_of(completions):
    return [completion.token_ids for completion in completions]


@pytest.fixture(scope="module")
def reference_tokens(tiny_llama):
    """Each prompt alone, no prefix caching, no chunking."""
    engine = make_engine(tiny_llama, enable_prefix_caching=False, enable_chunked_prefill=False)
    return [tokens_of(engine.generate([prompt], GREEDY))[0] for prompt in PROMPTS]


def test_batched_generation_equals_one_at_a_time(tiny_llama, reference_tokens):
    engine = make_engine(tiny_llama, enable_prefix_caching=False)
    assert tokens_of(engine.generate(PROMPTS, GREEDY)) == reference_tokens


def test_prefix_cache_hits_give_identical_tokens(tiny_llama, reference_tokens):
    engine = make_engine(tiny_llama)
    first = engine.generate(PROMPTS[:1], GREEDY)
    rest = engine.generate(PROMPTS[1:], GREEDY)
    assert tokens_of(first + rest) == reference_tokens
    # The second wave really was served from the cache.
    assert rest[0].num_cached_tokens == len(SHARED)
    assert rest[1].num_cached_tokens == 8


def test_chunked_prefill_gives_identical_tokens(tiny_llama, reference_tokens):
    engine = make_engine(tiny_llama, max_num_batched_tokens=6, enable_prefix_caching=False)
    assert tokens_of(engine.generate(PROMPTS, GREEDY)) == reference_tokens


def test_a_long_prompt_is_split_into_chunks_while_others_decode(tiny_llama):
    engine = make_engine(tiny_llama, max_num_batched_tokens=8, enable_prefix_caching=False)
    engine.add_request([5, 6], GREEDY, request_id="short")
    engine.step()
    engine.add_request(SHARED + SHARED, GREEDY, request_id="long")
    steps_to_first_token = 0
    short_tokens_meanwhile = 0
    while True:
        outputs = {out.request_id: out for out in engine.step()}
        steps_to_first_token += 1
        short_tokens_meanwhile += (
            len(outputs.get("short").new_token_ids) if "short" in outputs else 0
        )
        if "long" in outputs:
            break
    # 40 prompt tokens at most 7 per step next to the decode: at least 6 steps,
    # and the short request kept producing a token every step.
    assert steps_to_first_token >= 6
    assert short_tokens_meanwhile == min(steps_to_first_token, GREEDY.max_tokens - 1)


def test_preemption_under_block_pressure_gives_identical_tokens(tiny_llama, reference_tokens):
    # 14 blocks of 4 tokens cannot hold all four requests at full length (~45 blocks).
    engine = make_engine(tiny_llama, num_kv_blocks=14)
    assert tokens_of(engine.generate(PROMPTS, GREEDY)) == reference_tokens
    assert engine.scheduler.num_preemptions > 0
    assert engine.block_manager.num_free_blocks == 14


def test_triton_backend_gives_identical_tokens(tiny_llama, reference_tokens):
    pytest.importorskip("triton")
    engine = make_engine(tiny_llama, attention_backend="triton", max_num_batched_tokens=16)
    short = SamplingParams(max_tokens=3, ignore_eos=True)
    completions = engine.generate(PROMPTS[:2], short)
    assert tokens_of(completions) == [tokens[:3] for tokens in reference_tokens[:2]]


def test_events_mirror_the_cache_through_a_busy_run(tiny_llama):
    sink = RecordingSink(block_size=4)
    engine = make_engine(tiny_llama, sink=sink, num_kv_blocks=14)
    engine.generate(PROMPTS, GREEDY)
    engine.generate(PROMPTS[::-1], GREEDY)
    manager = engine.block_manager
    assert set(sink.view) == set(manager.cached)
    assert any(event[0] == "removed" for event in sink.events)
    # A router recomputes each stored id from the parent and the tokens carried.
    for event in sink.events:
        if event[0] == "stored":
            _, parent, block_ids, token_ids = event
            local = local_block_hashes(token_ids, block_size=4)
            assert chain_hashes(local, parent) == block_ids


def test_decoded_blocks_are_announced_chained_to_the_prompt(tiny_llama):
    sink = RecordingSink(block_size=4)
    engine = make_engine(tiny_llama, sink=sink)
    prompt = SHARED + [1, 2, 3]
    # 23 + 5 tokens, the last never fed back: 27 computed, 6 full blocks.
    [completion] = engine.generate([prompt], SamplingParams(max_tokens=5, ignore_eos=True))
    prompt_ids = engine.block_ids(prompt)
    all_ids = engine.block_ids(prompt + completion.token_ids)
    stored = [event for event in sink.events if event[0] == "stored"]
    # The prompt's 5 full blocks at once, then the block decode filled, after them.
    assert [(event[1], event[2]) for event in stored] == [
        (None, prompt_ids),
        (prompt_ids[-1], all_ids[5:6]),
    ]


def test_seeded_sampling_repeats_and_tiny_top_p_is_greedy(tiny_llama, reference_tokens):
    engine = make_engine(tiny_llama)
    seeded = SamplingParams(max_tokens=10, temperature=1.5, top_p=0.9, seed=3, ignore_eos=True)
    first = tokens_of(engine.generate(PROMPTS[:2], seeded))
    again = tokens_of(engine.generate(PROMPTS[:2], seeded))
    assert first == again
    assert first != reference_tokens[:2]
    nucleus_of_one = SamplingParams(max_tokens=10, temperature=1.0, top_p=1e-6, ignore_eos=True)
    assert tokens_of(engine.generate(PROMPTS[:2], nucleus_of_one)) == reference_tokens[:2]


def test_stops_at_eos_and_stop_tokens(tiny_llama, reference_tokens):
    engine = make_engine(tiny_llama)
    expected = reference_tokens[0]
    stop_at = expected[3]
    [completion] = engine.generate(
        [PROMPTS[0]], SamplingParams(max_tokens=10, stop_token_ids=(stop_at,), ignore_eos=True)
    )
    assert completion.token_ids == expected[: expected.index(stop_at) + 1]
    assert completion.finish_reason == "stop"


def test_timings_are_recorded_per_request(tiny_llama):
    engine = make_engine(tiny_llama)
    [completion] = engine.generate([PROMPTS[0]], GREEDY)
    timings = completion.timings
    assert timings.arrival <= timings.first_scheduled <= timings.first_token <= timings.finished
    assert timings.queue_time >= 0 and timings.prefill_time >= 0
    assert timings.ttft == timings.first_token - timings.arrival
    assert len(timings.inter_token_latencies) == GREEDY.max_tokens - 1


def test_abort_releases_blocks(tiny_llama):
    engine = make_engine(tiny_llama, enable_prefix_caching=False)
    request_id = engine.add_request(PROMPTS[1], GREEDY)
    engine.step()
    assert engine.block_manager.num_free_blocks < 64
    engine.abort_request(request_id)
    assert engine.block_manager.num_free_blocks == 64
    assert not engine.has_unfinished_requests()


def test_load_reports_queued_prefill_and_decode_blocks(tiny_llama):
    engine = make_engine(tiny_llama, max_num_batched_tokens=8, max_num_seqs=1)
    engine.add_request(PROMPTS[0], GREEDY)
    engine.add_request(PROMPTS[1], GREEDY)
    engine.step()
    load = engine.load()
    assert load.num_running == 1 and load.num_waiting == 1
    assert load.waiting_prefill_tokens == len(PROMPTS[1])
    assert load.running_prefill_tokens == len(PROMPTS[0]) - 8 - 1
    assert load.decode_blocks == 2


def test_load_counts_only_the_uncached_part_of_a_waiting_prompt(tiny_llama):
    engine = make_engine(tiny_llama, max_num_seqs=1)
    engine.generate([PROMPTS[0]], GREEDY)  # leaves SHARED's blocks cached
    engine.add_request(PROMPTS[3], GREEDY)
    engine.add_request(PROMPTS[1], GREEDY)
    engine.step()
    load = engine.load()
    assert load.num_waiting == 1
    assert load.waiting_prefill_tokens == len(PROMPTS[1]) - len(SHARED)


@pytest.mark.parametrize(
    "prompt, params, message",
    [
        ([], GREEDY, "at least one token"),
        ([1, 300], GREEDY, "token ids must be in"),
        ([1] * 2040, SamplingParams(max_tokens=16), "exceeds max_model_len"),
        ([1] * 300, SamplingParams(max_tokens=16), "more KV blocks"),
    ],
)
def test_bad_requests_are_rejected_and_leave_the_engine_usable(
    tiny_llama, reference_tokens, prompt, params, message
):
    engine = make_engine(tiny_llama)
    with pytest.raises(ValueError, match=message):
        engine.add_request(prompt, params)
    assert not engine.has_unfinished_requests()
    assert tokens_of(engine.generate(PROMPTS[:1], GREEDY)) == reference_tokens[:1]


def test_prompt_logits_agree_with_generation(tiny_llama, reference_tokens):
    engine = make_engine(tiny_llama)
    logits = engine.prompt_logits(PROMPTS[0])
    assert int(torch.argmax(logits[-1])) == reference_tokens[0][0]


def test_logprobs_of_generated_tokens_are_the_model_s(tiny_llama, reference_tokens):
    # Batched with a request that asks for none, and chunked: each token's
    # log probability is the log-softmax of the logits after its prefix.
    engine = make_engine(tiny_llama, max_num_batched_tokens=8)
    asks = SamplingParams(max_tokens=10, ignore_eos=True, logprobs=3)
    with_logprobs, without = engine.generate(PROMPTS[:2], [asks, GREEDY])
    assert with_logprobs.token_ids == reference_tokens[0]
    assert without.logprobs == []
    logits = engine.prompt_logits(PROMPTS[0] + with_logprobs.token_ids[:-1])
    expected = torch.log_softmax(logits[len(PROMPTS[0]) - 1 :], dim=-1)
    assert len(with_logprobs.logprobs) == len(with_logprobs.token_ids)
    for row, token, found in zip(
        expected, with_logprobs.token_ids, with_logprobs.logprobs, strict=True
    ):
        assert found.logprob == pytest.approx(row[token].item(), abs=1e-4)
        top_ids = [token_id for token_id, _ in found.top]
        assert top_ids[0] == token  # greedy: the chosen token is the most likely
        assert [lp for _, lp in found.top] == pytest.approx(row[top_ids].tolist(), abs=1e-4)
        assert len(found.top) == 3
