"""The request bodies the front door reads, checked by msgspec as they are
decoded (a field of the wrong type is a 400 naming it), then by `check`
before anything is routed. Fields may be null, as OpenAI's API allows, and
mean their default then. Fields the API defines that change nothing here
(`user`, `presence_penalty`, ...) are accepted, as are unknown ones; those
that would change the answer and cannot be honoured (`echo`, `best_of`, a
`response_format` other than text) are a 400."""

from __future__ import annotations

import math
import os
import re
from array import array
from typing import Annotated

import msgspec

from kvrouter._core import token_ids_from_json
from kvrouter.sampling_rules import MAX_LOGPROBS

# OpenAI's default for /v1/completions; chat requests run to the end of the
# answer, bounded by DEFAULT_CHAT_MAX_TOKENS.
DEFAULT_COMPLETION_MAX_TOKENS = 16
DEFAULT_CHAT_MAX_TOKENS = 1024
# Stop strings are matched on every token's text, on the event loop.
MAX_STOPS = 16
MAX_STOP_CHARS = 256
# vLLM's cache salt becomes the request's hashing namespace, which the
# router takes up to its max_namespace_chars (by default this many).
MAX_CACHE_SALT_CHARS = 256
U32 = 2**32
# What stands in for a prompt of token ids cut out of a body
# (`CompletionRequest.decode`): no client sends it, as it holds this
# process's random nonce.
_CUT_PROMPT = f"kvrouter-cut-prompt-{os.urandom(16).hex()}"
_CUT_PROMPT_JSON = msgspec.json.encode(_CUT_PROMPT)
_PROMPT_KEY = b'"prompt"'
_THEN_ARRAY = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*\[")


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


class _Sampling(msgspec.Struct, kw_only=True):
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    best_of: int | None = None
    response_format: dict | None = None
    ignore_eos: bool | None = None
    user: str | None = None
    # vLLM's: the prompt shares cached blocks only with requests of the same salt.
    cache_salt: str | None = None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def check(self) -> None:
        """ValueError, naming the field, for what the engine cannot honour."""
        if self.n not in (None, 1):
            raise ValueError("n: only n=1 is supported")
        if self.best_of not in (None, 1):
            raise ValueError("best_of: only 1 is supported")
        self.logprobs_count()
        if self.response_format not in (None, {"type": "text"}):
            raise ValueError("response_format: only text is supported")
        if self.temperature is not None and not 0 <= self.temperature <= 2:
            raise ValueError(f"temperature must be in [0, 2], not {self.temperature}")
        if self.top_p is not None and not (0 < self.top_p <= 1 and math.isfinite(self.top_p)):
            raise ValueError(f"top_p must be in (0, 1], not {self.top_p}")
        if self.top_k is not None and not -1 <= self.top_k < U32:
            raise ValueError(f"top_k must be -1 (off), 0 (off) or positive, not {self.top_k}")
        if any(not 0 <= t < U32 for t in self.stop_token_ids or ()):
            raise ValueError("stop_token_ids: each must be a token id, 0 to 2^32 - 1")
        stops = self.stop_strings()
        if len(stops) > MAX_STOPS:
            raise ValueError(f"stop: at most {MAX_STOPS} strings, not {len(stops)}")
        if any(not s or len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"stop: each string must have 1 to {MAX_STOP_CHARS} characters")
        salt = self.cache_salt
        if salt is not None and not (0 < len(salt) <= MAX_CACHE_SALT_CHARS and salt.isprintable()):
            raise ValueError(f"cache_salt must be 1 to {MAX_CACHE_SALT_CHARS} printable characters")

    @classmethod
    def decode(cls, body: bytes):
        """The body as this type; msgspec's DecodeError or ValidationError
        when it is not one."""
        return msgspec.json.decode(body, type=cls)

    def logprobs_count(self) -> int | None:
        """How many most likely tokens each generated token's log
        probability comes with; None when the request asks for none.
        ValueError for a count out of range."""
        raise NotImplementedError

    @property
    def sampling_top_k(self) -> int:
        """0 (off) for vLLM's -1."""
        return max(0, self.top_k or 0)

    @property
    def sampling_seed(self) -> int | None:
        """Any integer, as the engine's unsigned 64-bit seed."""
        return None if self.seed is None else self.seed % 2**64


class CompletionRequest(_Sampling, kw_only=True):
    # A string, token ids, or a list of one of either (msgspec takes one
    # list type in a union; `one_prompt` checks the rest); after `decode`,
    # token ids may be an array('I').
    prompt: str | list
    echo: bool | None = None

    @classmethod
    def decode(cls, body: bytes) -> CompletionRequest:
        """The body as a CompletionRequest. A prompt of token ids, most of a
        long prompt's body, is read by the core in one pass: it is cut out
        and a marker put in its place before msgspec decodes the rest, so
        that msgspec neither makes a Python int of each id nor skips over
        them. The marker holds this process's random nonce, so finding it
        as the decoded prompt proves that the array cut was the top-level
        prompt, not a "prompt" within another field; otherwise, or when
        the rest does not decode, the body is decoded whole, as it came."""
        cut = _cut_token_ids(body)
        if cut is not None:
            rest, tokens = cut
            try:
                request = msgspec.json.decode(rest, type=cls)
            except (msgspec.DecodeError, msgspec.ValidationError):
                request = None
            if request is not None and request.prompt == _CUT_PROMPT:
                request.prompt = tokens
                return request
        return msgspec.json.decode(body, type=cls)

    def check(self) -> None:
        super().check()
        if self.echo:
            raise ValueError("echo: not supported")

    def logprobs_count(self) -> int | None:
        # An int, 0 included, asks for the chosen token's and that many more;
        # false, as null, for none. A top_logprobs of 0 asks nothing (vLLM's).
        if self.top_logprobs:
            raise ValueError("top_logprobs: a chat completion's; here logprobs is the count")
        if self.logprobs is None or self.logprobs is False:
            return None
        if self.logprobs is True or not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be an integer from 0 to {MAX_LOGPROBS}")
        return self.logprobs

    def one_prompt(self) -> str | array:
        """The prompt as text or token ids; ValueError for anything else,
        or for more than one prompt."""
        return _one_prompt(self.prompt)


class ChatCompletionRequest(_Sampling, kw_only=True):
    messages: list[dict]
    tools: list[dict] | None = None
    max_completion_tokens: int | None = None
    add_generation_prompt: bool = True

    def logprobs_count(self) -> int | None:
        # `logprobs` true asks for them; `top_logprobs` for that many more.
        if self.logprobs is not None and not isinstance(self.logprobs, bool):
            raise ValueError("logprobs must be true or false")
        top = self.top_logprobs
        if top is not None and not 0 <= top <= MAX_LOGPROBS:
            raise ValueError(f"top_logprobs must be from 0 to {MAX_LOGPROBS}")
        if not self.logprobs:
            if top:
                raise ValueError("top_logprobs needs logprobs: true")
            return None
        return top or 0


TokenIds = list[Annotated[int, msgspec.Meta(ge=0, lt=U32)]]


def _one_prompt(prompt: object) -> str | array:
    if isinstance(prompt, array):
        return prompt  # token ids read by the core (`CompletionRequest.decode`)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and _token_ids(prompt):
        return array("I", prompt)
    raise ValueError("prompt: a string, token ids, or a list of one of either")


def _cut_token_ids(body: bytes) -> tuple[bytes, array] | None:
    """The body with the array of token ids after its first `"prompt"`
    replaced by `_CUT_PROMPT`, and those ids; None when what follows the
    first `"prompt"` is not a key's array of token ids (or there is none)."""
    at = body.find(_PROMPT_KEY)
    then = _THEN_ARRAY.match(body, at + len(_PROMPT_KEY)) if at >= 0 else None
    if then is None:
        return None
    start = then.end() - 1
    # An array of ids holds no bracket: the first one closes it.
    end = body.find(b"]", start) + 1
    ids = token_ids_from_json(memoryview(body)[start:end]) if end else None
    if ids is None:
        return None
    tokens = array("I")
    tokens.frombytes(ids)
    return body[:start] + _CUT_PROMPT_JSON + body[end:], tokens


def _token_ids(values: list) -> bool:
    """Whether every value is a token id: an int (not a bool) in 0..2^32-1."""
    try:
        msgspec.convert(values, TokenIds)
    except msgspec.ValidationError:
        return False
    return True
