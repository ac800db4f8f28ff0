"""One front-door request from its tokens to its answer: the proxied
Generate's chunks turned into text (detokenized, cut at stop strings and
stop token ids), with the tokens' log probabilities when asked, as OpenAI's
completion or chat-completion objects, streamed as server-sent events or
answered whole."""

from __future__ import annotations

import itertools
import logging
import os
import time
from array import array
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

import grpc
import msgspec

from kvrouter.frontend import ModelTokenizer, TextStream
from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.service.errors import ServiceError
from kvrouter.service.openai.errors import HttpError
from kvrouter.service.openai.logprobs import LogprobsWriter
from kvrouter.service.openai.observed import RequestRecord
from kvrouter.service.openai.requests import _Sampling

log = logging.getLogger("kvrouter.service.openai")
FINISH_REASONS = {gen.FINISH_REASON_STOP: "stop", gen.FINISH_REASON_LENGTH: "length"}
DONE = b"data: [DONE]\n\n"
# The proxied Generate's stream (GenerationProxy.stream).
Chunks = AsyncIterator[gen.GenerateResponse]
# Tokens and their log probabilities (gen.TokenLogprobs), one each.
Scored = tuple[list[int], list]
# Request ids: this process's random prefix and a count, unique across
# routers without a system call per request (as uuid4's urandom is).
_ID_PREFIX = os.urandom(8).hex()
_ids = itertools.count()


@dataclass
class Completion:
    """A request ready to run: `chat` picks the chat-completion shapes;
    `record` gathers what it measures. Its id is the request id of the
    proxied Generate, so the decision log names it too."""

    chat: bool
    body: _Sampling
    tokenizer: ModelTokenizer
    prompt: array
    max_tokens: int
    record: RequestRecord
    # The name it is routed under (`FrontDoor._model`): the model the body
    # names, or `model:adapter` for an adapter it names by itself.
    model: str
    # The conversation it belongs to (`session.session_id`); "" for none.
    session: str = ""

    def __post_init__(self) -> None:
        prefix = "chatcmpl" if self.chat else "cmpl"
        self.id = f"{prefix}-{_ID_PREFIX}{next(_ids):08x}"
        self.created = int(time.time())
        self.record.request_id = self.id
        self.record.prompt_tokens = len(self.prompt)
        # The request's stop ids, and the model's end-of-sequence ids (from
        # its tokenizer files, which may name more than the engine knows)
        # unless it asks to ignore them.
        eos = [] if self.body.ignore_eos else self.tokenizer.eos_token_ids
        self.stop_token_ids = sorted({*(self.body.stop_token_ids or ()), *eos})
        self.logprobs = self.body.logprobs_count()

    def generate_request(self) -> gen.GenerateRequest:
        """The proxied Generate's request, without the prompt's ids: they go
        beside it, as `prompt` (GenerationProxy.stream)."""
        body = self.body
        sampling = gen.SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=body.sampling_top_k,
            max_tokens=self.max_tokens,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=bool(body.ignore_eos),
        )
        if body.sampling_seed is not None:
            sampling.seed = body.sampling_seed
        if self.logprobs is not None:
            sampling.logprobs = self.logprobs
        return gen.GenerateRequest(
            request_id=self.id,
            namespace=body.cache_salt or "",
            model=self.model,
            sampling=sampling,
            session_id=self.session,
        )

    async def texts(self, first: gen.GenerateResponse | None, chunks: Chunks):
        """(text, finish_reason, scored) pieces of `first` and then `chunks`;
        finish_reason on the last only; `scored`, when the request asked for
        log probabilities, the tokens since the last piece with theirs
        (text held back for a stop string waits with them). A stop string
        or stop token id ends it early, which closes `chunks` and so cancels
        the request on its worker; otherwise `chunks` runs to its end, and
        the request is finished. A request its worker aborted is a
        ServiceError (UNAVAILABLE), not an answer."""
        record = self.record
        scored: Scored | None = None if self.logprobs is None else ([], [])
        async with aclosing(chunks):
            text = TextStream(
                self.tokenizer.detokenizer(),
                stop=self.body.stop_strings(),
                stop_token_ids=self.stop_token_ids,
            )
            chunk = first
            while chunk is not None:
                if chunk.token_ids:
                    record.tokens(len(chunk.token_ids))
                if chunk.HasField("stats"):
                    record.cached_tokens = chunk.stats.cached_tokens
                if chunk.finish_reason == gen.FINISH_REASON_CANCELLED:
                    raise ServiceError(
                        grpc.StatusCode.UNAVAILABLE, "the worker aborted the request; retry it"
                    )
                if scored is not None and chunk.token_ids:
                    piece = _feed_scored(text, chunk, scored)
                else:
                    piece = text.feed(chunk.token_ids)
                if text.stopped:
                    record.finish_reason = "stop"
                    yield piece, "stop", scored
                    return
                if chunk.finish_reason:
                    record.finish_reason = FINISH_REASONS[chunk.finish_reason]
                    yield piece + text.finish(), record.finish_reason, scored
                elif piece:
                    yield piece, None, scored
                    scored = None if scored is None else ([], [])
                chunk = await anext(chunks, None)

    def usage(self) -> dict:
        """OpenAI's usage, with the prompt tokens the worker served from its
        prefix cache as `prompt_tokens_details.cached_tokens`."""
        record = self.record
        return {
            "prompt_tokens": record.prompt_tokens,
            "completion_tokens": record.completion_tokens,
            "total_tokens": record.prompt_tokens + record.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": record.cached_tokens},
        }

    def _choice(
        self,
        text: str,
        finish_reason: str | None,
        logprobs: dict | None,
        *,
        delta: bool,
        first: bool = True,
    ) -> dict:
        if not self.chat:
            return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        # A stream names the role in its first delta only, as OpenAI's does.
        message = {"role": "assistant", "content": text} if first else {"content": text}
        key = "delta" if delta else "message"
        return {"index": 0, key: message, "logprobs": logprobs, "finish_reason": finish_reason}

    def _writer(self) -> LogprobsWriter | None:
        if self.logprobs is None:
            return None
        return LogprobsWriter(self.tokenizer.token_texts, chat=self.chat)

    def _object(self, choices: list, *, chunk: bool) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + (
            ".chunk" if chunk and self.chat else ""
        )
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.body.model,
            "choices": choices,
        }

    async def whole(self, first: gen.GenerateResponse | None, chunks: Chunks) -> dict:
        """The answer as one object. HttpError when the request fails."""
        parts, finish_reason = [], None
        every: Scored = ([], [])
        try:
            async for piece, reason, scored in self.texts(first, chunks):
                parts.append(piece)
                finish_reason = reason
                if scored is not None:
                    every[0].extend(scored[0])
                    every[1].extend(scored[1])
        except ServiceError as e:
            error = HttpError.from_grpc(e.code, e.message)
            self.record.failed(error.status, error.message)
            raise error from None
        writer = self._writer()
        logprobs = None if writer is None else writer.write(*every)
        choice = self._choice("".join(parts), finish_reason, logprobs, delta=False)
        answer = self._object([choice], chunk=False)
        return {**answer, "usage": self.usage()}

    async def events(self, first: gen.GenerateResponse | None, chunks: Chunks):
        """The answer as server-sent events, ending with [DONE]. A failure
        after the first event is an event with the error's body."""
        options = self.body.stream_options
        include_usage = bool(options and options.include_usage)
        opening = True
        writer = self._writer()
        try:
            async for piece, reason, scored in self.texts(first, chunks):
                logprobs = writer.write(*scored) if writer and scored[0] else None
                choice = self._choice(piece, reason, logprobs, delta=True, first=opening)
                yield _event(self._object([choice], chunk=True))
                opening = False
        except ServiceError as e:
            yield self._failed(HttpError.from_grpc(e.code, e.message))
        except Exception as e:  # noqa: BLE001 - the client is told, and the stream ends
            log.exception("front-door stream failed")
            yield self._failed(HttpError(500, f"internal error: {e}"))
        if include_usage:
            yield _event({**self._object([], chunk=True), "usage": self.usage()})
        yield DONE

    def _failed(self, error: HttpError) -> bytes:
        """The error event of a stream that fails after it began."""
        self.record.failed(error.status, error.message)
        return _event(error.body())


def _feed_scored(text: TextStream, chunk: gen.GenerateResponse, scored: Scored) -> str:
    """`text.feed` of `chunk`'s tokens one at a time, each added to `scored`
    with its log probabilities up to the one that stops the text (a stop
    token, or the last of a stop string): an engine's chunk may hold tokens
    past a stop, which are not part of the answer. A ServiceError when the
    worker sent no log probabilities (a build of kvrouter without them)."""
    ids, logprobs = chunk.token_ids, chunk.logprobs
    if len(logprobs) != len(ids):
        raise ServiceError(
            grpc.StatusCode.UNIMPLEMENTED,
            "a worker returned no log probabilities for this request",
        )
    piece = ""
    for token_id, found in zip(ids, logprobs, strict=True):
        piece += text.feed((token_id,))
        scored[0].append(token_id)
        scored[1].append(found)
        if text.stopped:
            break
    return piece


def _event(obj: dict) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"
