"""A front-door request's session, as the proxied Generate carries it to
the policy's affinity tie-break (tested through the router in
tests/policy/test_sessions.py and tests/service/test_sessions.py): the
`x-session-id` header, else the `user` field, digested when it is not a
valid session id; a bad header is a 400."""

from __future__ import annotations

from array import array

import pytest

from kvrouter._core import MAX_SESSION_CHARS
from kvrouter.service.openai.completion import Completion
from kvrouter.service.openai.errors import HttpError
from kvrouter.service.openai.observed import RequestRecord
from kvrouter.service.openai.requests import CompletionRequest
from kvrouter.service.openai.session import session_id


def test_the_header_wins_over_the_user_field():
    assert session_id("conversation-7", "someone@example.com") == "conversation-7"
    assert session_id(None, "someone@example.com") == "someone@example.com"
    assert session_id(None, None) == ""


def test_a_user_that_is_no_session_id_stands_for_its_digest():
    long_user = "u" * (MAX_SESSION_CHARS + 1)
    digest = session_id(None, long_user)
    assert digest.startswith("user-") and len(digest) <= MAX_SESSION_CHARS
    assert session_id(None, long_user) == digest
    assert session_id(None, "tab\there") != session_id(None, "tab\tthere")


@pytest.mark.parametrize("header", ["", "x" * (MAX_SESSION_CHARS + 1), "new\nline"])
def test_a_bad_header_is_400(header):
    with pytest.raises(HttpError) as refused:
        session_id(header, None)
    assert refused.value.status == 400


def test_the_session_reaches_the_proxied_generate(tokenizer):
    body = CompletionRequest(model="tiny", prompt="hi")
    run = Completion(
        False, body, tokenizer, array("I", [1, 2]), 4, RequestRecord("/v1/completions"), "tiny"
    )
    run.session = session_id("conversation-7", None)
    assert run.generate_request().session_id == "conversation-7"
