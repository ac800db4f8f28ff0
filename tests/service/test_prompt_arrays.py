"""A proxied Generate's prompt given beside its request, as the front door
gives it: packed for a kvrouter worker exactly as a client packs it, and
refused when the request carries a prompt of its own too."""

from __future__ import annotations

from array import array

import grpc
import pytest

from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.service.convert import check_prompt_array
from kvrouter.service.errors import ServiceError
from kvrouter.service.proxied_request import packed_prompt, prompt_array

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
