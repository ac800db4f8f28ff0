"""A request split between two engines that registered SGLang's bootstrap
protocol (KV_TRANSFER_SGLANG), against stub engines on 127.0.0.1 and a
real `kvrouter serve`: both are sent the request at once with P's
bootstrap host and port and one room; D (which sends nothing until P has
seen the room) streams the answer. P failing before D's first token
cancels D's call and serves the request whole on D."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest
from waiting import wait_until

from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.service.engine_split import Engine, PrefillFailed, SplitCall, sglang
from kvrouter.service.worker_calls import Deadline, WorkerFailure

from .helpers import generate, split_engines, split_pair, split_router

PROMPT = [random.Random(6).randrange(3, 256) for _ in range(200)]
BOOTSTRAP_PORT = 8998


@pytest.fixture(scope="module")
def router():
    process = split_router()
    yield process
    process.kill()


@pytest.fixture(scope="module")
def engines(router):
    yield from split_engines(router.target, "sglang", BOOTSTRAP_PORT)


@pytest.fixture
def pair(router, engines):
    yield from split_pair(router.target, engines, PROMPT)


def test_both_engines_get_the_prefill_engines_bootstrap_and_one_room(router, pair):
    prefill, decode, prefill_id, decode_id = pair
    answer = generate(router.target, PROMPT)
    assert answer.token_ids == decode.tokens[:5]
    assert (answer.prefill_worker, answer.decode_worker) == (prefill_id, decode_id)
    assert answer.stats.disaggregated and answer.stats.retries == 0
    (asked,) = prefill.received
    (sent,) = decode.received
    assert asked["prompt"] == sent["prompt"] == PROMPT
    assert asked["stream"] is False and sent["stream"] is True
    fields = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
    assert [asked[f] for f in fields] == [sent[f] for f in fields]
    assert (sent["bootstrap_host"], sent["bootstrap_port"]) == ("127.0.0.1", BOOTSTRAP_PORT)
    assert 0 <= sent["bootstrap_room"] < 2**63
    assert (
        generate(router.target, PROMPT)
        and decode.received[-1]["bootstrap_room"] != sent["bootstrap_room"]
    )


@pytest.mark.parametrize("mode", ["unavailable", "hang"])
def test_a_failed_prefill_cancels_the_decode_and_serves_it_whole(router, pair, mode):
    prefill, decode, _, decode_id = pair
    prefill.mode = mode
    answer = generate(router.target, PROMPT)
    assert answer.token_ids == decode.tokens[:5]
    assert (answer.prefill_worker, answer.decode_worker) == (None, decode_id)
    assert answer.stats.retries == 1 and not answer.stats.disaggregated
    waiting, whole = decode.received
    assert "bootstrap_room" in waiting and "bootstrap_room" not in whole
    wait_until(lambda: decode.disconnects == 1, what="the waiting decode to be cancelled")


class SilentPrefillEngines:
    """Engines for one split call: P fails once `fail_prefill` is set; D
    records the first-token time it was given and sends nothing."""

    def __init__(self) -> None:
        self.fail_prefill = asyncio.Event()
        self.first_token_s: float | None = None

    async def complete(self, worker_id, address, request, body, deadline, timeout_s):
        await self.fail_prefill.wait()
        raise WorkerFailure(worker_id, grpc.StatusCode.DEADLINE_EXCEEDED, "silent")

    async def generate(self, worker_id, address, request, prompt, deadline, **limits):
        self.first_token_s = limits["first_token_s"]
        await asyncio.Event().wait()
        yield [], 0


def test_the_waiting_decode_is_not_timed_out_before_the_prefill_engines_time_is_up():
    """D sends nothing until P is done, so a P silent for all its time must
    fail as P (the request then served whole on D), not time D out first."""

    async def run():
        engines = SilentPrefillEngines()
        call = SplitCall(
            engines=engines,
            request=gen.GenerateRequest(sampling=gen.SamplingParams(max_tokens=5)),
            prompt=PROMPT,
            prefill=Engine(1, "http://127.0.0.1:1", BOOTSTRAP_PORT),
            decode=Engine(2, "http://127.0.0.1:2"),
            deadline=Deadline(60),
            prefill_s=3.0,
            first_token_s=3.0,
            token_gap_s=3.0,
            prefill_done=lambda: None,
        )
        tokens = sglang.stream(call)
        first = asyncio.ensure_future(anext(tokens))
        while engines.first_token_s is None:
            await asyncio.sleep(0)
        assert engines.first_token_s > call.prefill_s
        engines.fail_prefill.set()
        with pytest.raises(PrefillFailed):
            await first

    asyncio.run(run())
