"""A completion body's prompt, read as the front door reads it: a prompt
of token ids is cut out of the body and read by the core, the rest decoded
by msgspec, and every form of prompt reads the same whichever way it went,
including where another field holds a "prompt" of its own."""

from __future__ import annotations

import json
from array import array

import msgspec
import pytest

from kvrouter.service.openai.requests import CompletionRequest


def read(body: dict | bytes) -> str | array:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return CompletionRequest.decode(data).one_prompt()


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("some text", "some text"),
        (["some text"], "some text"),
        ([7, 0, 4294967295], array("I", [7, 0, 4294967295])),
        ([[7, 8]], array("I", [7, 8])),
        ([], array("I")),
    ],
)
def test_every_form_of_prompt_reads_as_its_text_or_ids(prompt, expected):
    got = read({"model": "m", "prompt": prompt})
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(
    "prompt", [7, None, [-1], [4294967296], [1.5], [1, True], ["a", "b"], [[1], [2]]]
)
def test_anything_else_is_a_value_error(prompt):
    with pytest.raises(ValueError, match="prompt"):
        read({"model": "m", "prompt": prompt})


def test_a_prompt_of_ids_is_read_by_the_core_and_text_is_not():
    ids = CompletionRequest.decode(b'{"model": "m", "prompt" :\n [1, 2], "max_tokens": 3}')
    assert ids.prompt == array("I", [1, 2]) and ids.max_tokens == 3
    text = CompletionRequest.decode(b'{"model": "m", "prompt": "[1, 2]"}')
    assert text.prompt == "[1, 2]"


def test_an_array_in_another_field_is_never_taken_for_the_prompt():
    nested = b'{"metadata": {"prompt": [1, 2]}, "model": "m", "prompt": null}'
    with pytest.raises(msgspec.ValidationError, match="prompt"):
        CompletionRequest.decode(nested)
    with pytest.raises(msgspec.ValidationError, match="prompt"):
        CompletionRequest.decode(b'{"metadata": {"prompt": [1, 2]}, "model": "m"}')


def test_a_body_that_does_not_decode_is_refused_as_it_came():
    bad = b'{"model": "m", "prompt": [1, 2], "max_tokens": "many"}'
    with pytest.raises(msgspec.ValidationError) as refused:
        CompletionRequest.decode(bad)
    with pytest.raises(msgspec.ValidationError) as whole:
        msgspec.json.decode(bad, type=CompletionRequest)
    assert str(refused.value) == str(whole.value)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # Another field's "prompt" comes first: the prompt read is the top level's.
        (b'{"metadata": {"prompt": [1]}, "model": "m", "prompt": "text"}', "text"),
        (b'{"metadata": {"prompt": "x"}, "model": "m", "prompt": [1, 2]}', array("I", [1, 2])),
    ],
)
def test_another_fields_prompt_leaves_the_prompt_as_it_is(body, expected):
    assert read(body) == expected
