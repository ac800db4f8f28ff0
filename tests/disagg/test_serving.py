"""Proxied generation through the router over real processes: split output
equals aggregated output, later turns follow their prefix, the decode worker
prefills locally when it already holds almost the whole prompt, bad
sampling settings are refused before routing, and cancelled or late
requests leave nothing behind."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from bad_sampling import BAD_SAMPLING
from waiting import wait_until

from kvrouter.client import DeadlineExceeded, InvalidArgument
from kvrouter.client.generate import GenerateClient
from kvrouter.demo.burst import BURST, STREAMS, run_burst
from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.proto_gen import router_pb2_grpc

from .conftest import start_cluster
from .helpers import BLOCK, all_idle, generate, overlap, prompt


@pytest.fixture(scope="module")
def cluster(tiny_model, tmp_path_factory):
    cluster = start_cluster(tiny_model, tmp_path_factory, {}, [])
    yield cluster
    cluster.stop()


def test_split_generation_equals_aggregated(settled, reference):
    for length in (65, 200, 333):
        tokens = prompt(length, length)
        result = generate(settled.target, tokens, 16)
        assert result.stats.disaggregated
        assert result.prefill_worker in (1, 2) and result.decode_worker in (3, 4)
        assert result.token_ids == reference(tokens, 16)
        assert result.finish_reason == "length"
        assert result.stats.blocks_transferred + result.stats.blocks_reused == length // BLOCK


@pytest.mark.parametrize("max_tokens", [1, 6])
def test_split_generation_streams_each_tokens_logprobs(settled, scored, max_tokens):
    # The first token's come from the prefill worker through the hand-off.
    tokens = prompt(11 + max_tokens, 150)
    result = generate(settled.target, tokens, max_tokens, logprobs=2)
    assert result.prefill_worker in (1, 2)
    ids, want = scored(tokens, max_tokens, 2)
    assert result.token_ids == ids
    assert [found.logprob for found in result.logprobs] == pytest.approx(
        [w.logprob for w in want], abs=1e-4
    )
    for found, w in zip(result.logprobs, want, strict=True):
        assert [t for t, _ in found.top] == [t for t, _ in w.top]
        assert [lp for _, lp in found.top] == pytest.approx([lp for _, lp in w.top], abs=1e-4)
    assert generate(settled.target, tokens, 2).logprobs == []


def test_first_token_only(settled, reference):
    tokens = prompt(7, 150)
    result = generate(settled.target, tokens, 1)
    assert result.token_ids == reference(tokens, 1)
    assert result.prefill_worker in (1, 2) and result.finish_reason == "length"


def test_second_turn_follows_its_prefix_and_moves_only_new_blocks(settled, reference):
    first = prompt(1, 300)
    turn1 = generate(settled.target, first, 8)
    assert turn1.stats.disaggregated
    second = first + turn1.token_ids + prompt(2, 200)
    # The decode worker's events (imported and computed blocks) reach the router.
    wait_until(
        lambda: overlap(settled.target, second, turn1.decode_worker) >= len(first) // BLOCK,
        what="the first turn's blocks in the router's index",
    )
    turn2 = generate(settled.target, second, 8)
    assert turn2.token_ids == reference(second, 8)
    assert turn2.stats.disaggregated
    assert turn2.decode_worker == turn1.decode_worker
    assert turn2.prefill_worker == turn1.prefill_worker
    assert turn2.stats.cached_tokens >= len(first) // BLOCK * BLOCK
    reused, moved = turn2.stats.blocks_reused, turn2.stats.blocks_transferred
    assert reused >= len(first) // BLOCK
    assert moved == len(second) // BLOCK - reused


def test_decode_worker_prefills_locally_when_it_holds_almost_everything(settled, reference):
    first = prompt(3, 300)
    turn1 = generate(settled.target, first, 8)
    second = first + turn1.token_ids + prompt(4, 20)
    wait_until(
        lambda: overlap(settled.target, second, turn1.decode_worker) >= len(first) // BLOCK,
        what="the first turn's blocks in the router's index",
    )
    turn2 = generate(settled.target, second, 8)
    assert turn2.token_ids == reference(second, 8)
    assert not turn2.stats.disaggregated and turn2.prefill_worker is None
    assert turn2.decode_worker == turn1.decode_worker
    assert turn2.stats.cached_tokens >= len(first) // BLOCK * BLOCK


def test_cancelled_request_is_aborted_on_the_workers(settled):
    with grpc.insecure_channel(settled.target) as channel:
        call = router_pb2_grpc.RouterStub(channel).Generate(
            gen.GenerateRequest(
                tokens=prompt(5, 200),
                sampling=gen.SamplingParams(max_tokens=1500, ignore_eos=True),
            )
        )
        next(call)
        call.cancel()
    wait_until(lambda: all_idle(settled), what="the request to be aborted everywhere")


def test_deadline_ends_the_request_cleanly(settled):
    with pytest.raises(DeadlineExceeded):
        generate(settled.target, prompt(6, 200), 1500, timeout=0.5)
    wait_until(lambda: all_idle(settled), what="the request to be aborted everywhere")


def test_bad_input_is_refused(settled):
    with pytest.raises(InvalidArgument):
        generate(settled.target, [], 4)
    with pytest.raises(InvalidArgument):
        generate(settled.target, [1, 2, 3], 0)
    with pytest.raises(InvalidArgument, match=r"\[0, 256\)"):
        generate(settled.target, [1, 2, 100_000], 4)


def test_bad_sampling_is_refused_while_other_streams_run(settled, reference):
    healthy = [prompt(300 + i, 40 + 60 * i) for i in range(6)]

    async def run():
        async with GenerateClient(settled.target, timeout=60.0) as client:
            streams = [client.stream(p, max_tokens=24, ignore_eos=True) for p in healthy]
            firsts = [await anext(s) for s in streams]

            async def refused(sampling: dict) -> Exception:
                try:
                    await client.generate(prompt(7, 150), max_tokens=8, **sampling)
                except InvalidArgument as e:
                    return e
                raise AssertionError(f"{sampling} was accepted")

            errors = await asyncio.gather(*(refused(s) for s, _ in BAD_SAMPLING))

            async def rest(first, stream) -> list[int]:
                return [*first.token_ids, *[t async for c in stream for t in c.token_ids]]

            return errors, await asyncio.gather(*map(rest, firsts, streams))

    errors, outputs = asyncio.run(run())
    for error, (_, field) in zip(errors, BAD_SAMPLING, strict=True):
        assert field in str(error)
    for tokens, out in zip(healthy, outputs, strict=True):
        assert out == reference(tokens, 24)


def test_concurrent_requests_all_match_the_reference(settled, reference):
    shared = prompt(90, 160)
    prompts = [shared + prompt(100 + i, 40 + 37 * i) for i in range(12)]

    async def run():
        async with GenerateClient(settled.target, timeout=60.0) as client:
            return await asyncio.gather(
                *(client.generate(p, max_tokens=12, ignore_eos=True) for p in prompts)
            )

    results = asyncio.run(run())
    for tokens, result in zip(prompts, results, strict=True):
        assert result.token_ids == reference(tokens, 12)
    assert any(r.stats.disaggregated for r in results)


def test_heartbeats_carry_the_load(settled):
    with grpc.insecure_channel(settled.target) as channel:
        call = router_pb2_grpc.RouterStub(channel).Generate(
            gen.GenerateRequest(
                tokens=prompt(95, 100),
                sampling=gen.SamplingParams(max_tokens=1800, ignore_eos=True),
            )
        )
        decode_worker = next(call).decode_worker
        wait_until(
            lambda: any(
                w.worker_id == decode_worker and w.active_requests >= 1
                for w in settled.list_workers()
            ),
            what="the decode worker to report its running request",
        )
        call.cancel()


def test_the_demos_burst_runs_under_its_streams(settled):
    """`kvrouter demo`'s burst: every long prompt gets its first token while
    the streams decode, whose gaps between tokens are what it reports."""
    run = asyncio.run(run_burst(settled.target))
    assert len(run.burst_ttft_ms) == BURST and min(run.burst_ttft_ms) > 0
    # Each stream decodes all along the burst.
    assert len(run.gaps_ms) >= STREAMS
