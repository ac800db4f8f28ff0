"""Protobuf request fields to the core's types, with input validation.
(KV events convert through `kvrouter.events`.)"""

from __future__ import annotations

from kvrouter._core import check_model as core_check_model
from kvrouter._core import check_namespace as core_check_namespace
from kvrouter._core import prompt_length
from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.sampling_rules import check_logprobs, wire_top_p
from kvrouter.sampling_rules import check_sampling as check_sampling_values
from kvrouter.service.errors import invalid

ROLE_NAMES = {pb.ROLE_PREFILL: "prefill", pb.ROLE_DECODE: "decode", pb.ROLE_BOTH: "both"}
ROLE_VALUES = {name: value for value, name in ROLE_NAMES.items()}


def prompt_tokens(request, max_tokens: int) -> bytes | list[int]:
    """The prompt of a GenerateRequest: the packed little-endian bytes as
    they arrived (the core reads them in place), or a list. Checked by the
    rule the routing path applies in the core."""
    packed = request.tokens_u32le
    try:
        prompt_length(len(request.tokens), len(packed), max_tokens)
    except ValueError as e:
        raise invalid(str(e)) from None
    return packed if packed else list(request.tokens)


def check_prompt_array(request, prompt, max_tokens: int) -> None:
    """A prompt passed beside its GenerateRequest (`prompt_tokens`' rule,
    with the request's own token fields left empty)."""
    if request.tokens_u32le or request.tokens:
        raise invalid("the prompt is given twice: in the request and beside it")
    try:
        prompt_length(len(prompt), 0, max_tokens)
    except ValueError as e:
        raise invalid(str(e)) from None


def check_namespace(namespace: str, max_chars: int) -> None:
    """The rule the routing path applies in the core."""
    try:
        core_check_namespace(namespace, max_chars)
    except ValueError as e:
        raise invalid(str(e)) from None


def check_model(name: str, max_chars: int, field_name: str = "model") -> None:
    """The rule the routing path applies in the core to a requested model,
    applied as well to the model and adapter names a worker registers."""
    try:
        core_check_model(name, max_chars)
    except ValueError as e:
        raise invalid(str(e).replace("model", field_name, 1)) from None


def check_sampling(sampling: gen.SamplingParams) -> None:
    """The rule the worker and its engine apply, before anything is routed."""
    try:
        check_sampling_values(
            sampling.max_tokens, sampling.temperature, wire_top_p(sampling.top_p), sampling.top_k
        )
        check_logprobs(sampling.logprobs if sampling.HasField("logprobs") else None)
    except ValueError as e:
        raise invalid(str(e)) from None
