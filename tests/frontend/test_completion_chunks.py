"""A front-door completion read from the proxied Generate's chunks: a
request its worker aborted is an error, not an answer that ends in
"stop", and the worker's cached prompt tokens reach the usage."""

from __future__ import annotations

import asyncio
from array import array

import msgspec

from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.service.openai.completion import Completion
from kvrouter.service.openai.observed import RequestRecord
from kvrouter.service.openai.requests import CompletionRequest


def completion(tokenizer) -> Completion:
    body = CompletionRequest(model="tiny", prompt="hi", stream=True)
    return Completion(
        False, body, tokenizer, array("I", [1, 2, 3]), 4, RequestRecord("/v1/completions"), "tiny"
    )


async def chunks(*responses):
    for response in responses:
        yield response


def events(run: Completion, first, *rest) -> list:
    async def read():
        return [e async for e in run.events(first, chunks(*rest))]

    raw = asyncio.run(read())
    return [msgspec.json.decode(e[6:]) for e in raw[:-1]]


def test_an_aborted_request_ends_in_a_503_event(tokenizer):
    run = completion(tokenizer)
    got = events(
        run,
        gen.GenerateResponse(token_ids=[65]),
        gen.GenerateResponse(finish_reason=gen.FINISH_REASON_CANCELLED),
    )
    assert got[-1]["error"]["code"] == "unavailable"
    assert "aborted" in got[-1]["error"]["message"]
    assert all(c["finish_reason"] != "stop" for e in got[:-1] for c in e["choices"])
    assert run.record.status == 503


def test_the_workers_cached_tokens_are_in_the_usage(tokenizer):
    run = completion(tokenizer)
    last = gen.GenerateResponse(
        token_ids=[65],
        finish_reason=gen.FINISH_REASON_LENGTH,
        stats=gen.RequestStats(cached_tokens=2),
    )
    events(run, last)
    assert run.usage()["prompt_tokens_details"] == {"cached_tokens": 2}
    assert run.record.finish_reason == "length"
