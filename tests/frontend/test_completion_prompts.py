"""A completion body's prompt, read as the front door reads it: a prompt
of token ids is cut out of the body and read by the core, the rest decoded
by msgspec, and every form of prompt reads the same whichever way it went,
including where another field holds a "prompt" of its own: generated
bodies read exactly as decoding them whole reads them, errors included."""

from __future__ import annotations

import json
from array import array

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# Bodies as clients write them, compact or spaced, and as they should not:
# the prompt in any form, another field holding a "prompt" of its own, the
# prompt twice, null, or missing.
token_ids = st.lists(st.integers(0, 2**32 - 1), max_size=6)
prompts = st.one_of(
    st.text(max_size=8),
    token_ids,
    st.lists(st.text(max_size=4), min_size=1, max_size=2),
    st.lists(token_ids, min_size=1, max_size=2),
    st.lists(st.one_of(st.integers(-2, 2**33), st.booleans(), st.floats(0, 1)), max_size=3),
    st.none(),
)
fields = st.dictionaries(
    st.sampled_from(["max_tokens", "metadata", "user", "stop"]),
    st.one_of(
        st.integers(1, 9),
        st.text(max_size=12),
        st.fixed_dictionaries({"prompt": prompts}),
    ),
    max_size=3,
)


@st.composite
def bodies(draw) -> bytes:
    body = {"model": "m", **draw(fields)}
    keys = draw(st.sampled_from([["prompt"], [], ["prompt", "prompt"]]))
    parts = [json.dumps(k) + ": " + json.dumps(v) for k, v in body.items()]
    for key in keys:
        colon = draw(st.sampled_from([":", " : ", ":\n "]))
        separators = draw(st.sampled_from([(",", ":"), (", ", ": ")]))
        value = json.dumps(draw(prompts), separators=separators)
        parts.insert(draw(st.integers(0, len(parts))), json.dumps(key) + colon + value)
    return ("{" + draw(st.sampled_from([",", ", "])).join(parts) + "}").encode()


def outcome(decode, body: bytes):
    """What the front door makes of `body`: its prompt, or its error."""
    try:
        return ("prompt", decode(body).one_prompt())
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
        return ("refused", type(e).__name__, str(e))


@settings(max_examples=400, deadline=None)
@given(bodies())
def test_cutting_out_the_ids_reads_every_body_as_decoding_it_whole_does(body):
    whole = outcome(lambda b: msgspec.json.decode(b, type=CompletionRequest), body)
    assert outcome(CompletionRequest.decode, body) == whole
