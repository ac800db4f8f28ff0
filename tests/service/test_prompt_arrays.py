"""A proxied Generate's prompt given beside its request, as the front door
gives it: packed for a kvrouter worker exactly as a client packs it, and
refused when the request carries a prompt of its own too; an engine's
request (its prompt sent as JSON) never given a copy of the ids."""

from __future__ import annotations

from array import array
from types import SimpleNamespace

import grpc
import pytest

from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.service.convert import check_prompt_array
from kvrouter.service.errors import ServiceError
from kvrouter.service.proxied_request import ProxiedRequest, packed_prompt, prompt_array

IDS = [0, 1, 255, 256, 65_535, 151_643, 2**32 - 1]


def test_packed_prompt_is_the_little_endian_bytes_a_request_carries():
    packed = packed_prompt(array("I", IDS))
    assert packed == b"".join(i.to_bytes(4, "little") for i in IDS)
    assert prompt_array(packed).tolist() == IDS
    assert prompt_array(IDS).tolist() == IDS


def test_a_prompt_beside_a_request_that_has_one_is_refused():
    beside = array("I", IDS)
    check_prompt_array(gen.GenerateRequest(), beside, 100)
    for request in (
        gen.GenerateRequest(tokens=[1, 2]),
        gen.GenerateRequest(tokens_u32le=packed_prompt(beside)),
    ):
        with pytest.raises(ServiceError) as refused:
            check_prompt_array(request, beside, 100)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_a_prompt_beside_the_request_is_held_to_the_prompt_limit():
    with pytest.raises(ServiceError) as refused:
        check_prompt_array(gen.GenerateRequest(), array("I", IDS), len(IDS) - 1)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(ServiceError):
        check_prompt_array(gen.GenerateRequest(), array("I"), 10)


def test_a_kvrouter_worker_gets_the_ids_in_its_request_an_engine_beside_it():
    request = gen.GenerateRequest(request_id="r", sampling=gen.SamplingParams(max_tokens=8))
    prompt = array("I", IDS)
    run = ProxiedRequest(
        SimpleNamespace(config=None), request, prompt, SimpleNamespace(decode_worker=1), None
    )
    assert not run._attempt(with_prompt=False).tokens_u32le
    assert not request.tokens_u32le
    assert prompt_array(run._attempt(with_prompt=True).tokens_u32le).tolist() == IDS
    # A continuation after two tokens the client already has.
    run.generated = [7, 9]
    request.ClearField("tokens_u32le")
    for with_prompt, sent in ((False, []), (True, [*IDS, 7, 9])):
        attempt = run._attempt(with_prompt=with_prompt)
        assert list(attempt.tokens) == sent and not attempt.tokens_u32le
        assert attempt.sampling.max_tokens == 6
    assert run._so_far().tolist() == [*IDS, 7, 9]
