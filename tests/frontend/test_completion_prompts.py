"""A completion body's prompt, read as the front door reads it: the body's
type is guessed from its bytes (a prompt of token ids is kept as JSON and
read by the core), and every form of prompt reads the same whatever the
guess."""

from __future__ import annotations

import json
from array import array

import msgspec
import pytest

from kvrouter.service.openai.requests import CompletionRequest, TokenIdsCompletionRequest


def read(body: dict | bytes) -> str | array:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return msgspec.json.decode(data, type=CompletionRequest.decoded_as(data)).one_prompt()


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


def test_a_prompt_of_ids_is_kept_as_json_and_text_is_not():
    ids = b'{"model": "m", "prompt" :\n [1, 2]}'
    assert CompletionRequest.decoded_as(ids) is TokenIdsCompletionRequest
    assert CompletionRequest.decoded_as(b'{"model": "m", "prompt": "[1, 2]"}') is CompletionRequest


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # Another "prompt" key comes first: each guess is wrong, the prompt is not.
        (b'{"metadata": {"prompt": [1]}, "model": "m", "prompt": "text"}', "text"),
        (b'{"metadata": {"prompt": "x"}, "model": "m", "prompt": [1, 2]}', array("I", [1, 2])),
    ],
)
def test_a_wrong_guess_reads_the_same_prompt(body, expected):
    assert read(body) == expected
