"""A front-door request's session, the policy's tie-breaker among equally
good workers (docs/routing.md, "Session affinity"): the `x-session-id`
header, else the OpenAI `user` field.

The header is the caller's own session id and must be one (at most
`MAX_SESSION_CHARS` printable characters; a 400 otherwise). `user` is any
string OpenAI takes, so one that is not a valid session id stands for its
digest instead."""

from __future__ import annotations

import hashlib

from kvrouter._core import MAX_SESSION_CHARS
from kvrouter.service.openai.errors import HttpError

SESSION_HEADER = "x-session-id"


def session_id(header: str | None, user: str | None) -> str:
    if header is not None:
        if not _valid(header):
            raise HttpError(
                400,
                f"{SESSION_HEADER} must be 1 to {MAX_SESSION_CHARS} printable characters",
            )
        return header
    if not user:
        return ""
    if _valid(user):
        return user
    return "user-" + hashlib.blake2b(user.encode(), digest_size=16).hexdigest()


def _valid(value: str) -> bool:
    return 0 < len(value) <= MAX_SESSION_CHARS and value.isprintable()
