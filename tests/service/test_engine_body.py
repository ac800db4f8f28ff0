"""An engine's request body, its prompt's ids written by the core: the
same JSON a general encoder writes, the prompt first."""

from __future__ import annotations

from array import array

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvrouter._core import prompt_body_json
from kvrouter.service.openai_worker import body_json

IDS = st.lists(st.integers(0, 2**32 - 1), max_size=300)
FIELDS = st.dictionaries(
    st.text(max_size=8).filter(lambda name: name != "prompt"),
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20),
    max_size=6,
)


@given(IDS, FIELDS)
def test_a_body_reads_as_its_fields_after_the_prompt(ids, fields):
    body = body_json({"prompt": array("I", ids), **fields})
    decoded = msgspec.json.decode(body)
    assert decoded == {"prompt": ids, **fields}
    assert next(iter(decoded)) == "prompt"


def test_a_body_of_the_prompt_alone():
    assert prompt_body_json([0, 7, 4_294_967_295], b"{}") == b'{"prompt":[0,7,4294967295]}'
    assert prompt_body_json([], b'{"n":1}') == b'{"prompt":[],"n":1}'


@pytest.mark.parametrize("fields", [b"", b"{", b"[1]", b"1"])
def test_fields_that_are_no_object_are_refused(fields):
    with pytest.raises(ValueError, match="JSON object"):
        prompt_body_json([1], fields)
