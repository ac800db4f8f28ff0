"""A request split between two engines that registered SGLang's bootstrap
protocol (KV_TRANSFER_SGLANG), against stub engines on 127.0.0.1 and a
real `kvrouter serve`: both are sent the request at once with P's
bootstrap host and port and one room; D (which sends nothing until P has
seen the room) streams the answer. P failing before D's first token
cancels D's call and serves the request whole on D."""

from __future__ import annotations

import random

import pytest
from waiting import wait_until

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
