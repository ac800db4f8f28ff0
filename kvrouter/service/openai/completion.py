"""One front-door request from its tokens to its answer: the proxied
Generate's chunks turned into text (detokenized, cut at stop strings and
stop token ids), as OpenAI's completion or chat-completion objects,
streamed as server-sent events or answered whole."""

from __future__ import annotations

import logging
import time
import uuid
from array import array
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

import msgspec

from kvrouter.frontend import ModelTokenizer, TextStream
from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.service.errors import ServiceError
from kvrouter.service.openai.errors import HttpError
from kvrouter.service.openai.requests import _Sampling

log = logging.getLogger("kvrouter.service.openai")
FINISH_REASONS = {gen.FINISH_REASON_STOP: "stop", gen.FINISH_REASON_LENGTH: "length"}
DONE = b"data: [DONE]\n\n"


@dataclass
class Completion:
    """A request ready to run: `chat` picks the chat-completion shapes."""

    chat: bool
    body: _Sampling
    tokenizer: ModelTokenizer
    prompt: list[int]
    max_tokens: int

    def __post_init__(self) -> None:
        prefix = "chatcmpl" if self.chat else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.completion_tokens = 0

    def stop_token_ids(self) -> list[int]:
        """The request's stop ids, and the model's end-of-sequence ids (from
        its tokenizer files, which may name more than the engine knows)
        unless it asks to ignore them."""
        eos = [] if self.body.ignore_eos else self.tokenizer.eos_token_ids
        return sorted({*(self.body.stop_token_ids or ()), *eos})

    def generate_request(self) -> gen.GenerateRequest:
        body = self.body
        sampling = gen.SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=body.sampling_top_k,
            max_tokens=self.max_tokens,
            stop_token_ids=self.stop_token_ids(),
            ignore_eos=bool(body.ignore_eos),
        )
        if body.sampling_seed is not None:
            sampling.seed = body.sampling_seed
        return gen.GenerateRequest(
            tokens_u32le=array("I", self.prompt).tobytes(), model=body.model, sampling=sampling
        )

    async def texts(self, chunks: AsyncIterator[gen.GenerateResponse]):
        """(text, finish_reason) pieces; finish_reason on the last only. A
        stop string or stop token id ends it early, which closes `chunks`
        and so cancels the request on its worker; otherwise `chunks` runs
        to its end, and the request is finished."""
        async with aclosing(chunks):
            text = TextStream(
                self.tokenizer.detokenizer(),
                stop=self.body.stop_strings(),
                stop_token_ids=self.stop_token_ids(),
            )
            async for chunk in chunks:
                self.completion_tokens += len(chunk.token_ids)
                piece = text.feed(chunk.token_ids)
                if text.stopped:
                    yield piece, "stop"
                    return
                if chunk.finish_reason:
                    reason = FINISH_REASONS.get(chunk.finish_reason, "stop")
                    yield piece + text.finish(), reason
                elif piece:
                    yield piece, None

    def usage(self) -> dict:
        return {
            "prompt_tokens": len(self.prompt),
            "completion_tokens": self.completion_tokens,
            "total_tokens": len(self.prompt) + self.completion_tokens,
        }

    def _choice(
        self, text: str, finish_reason: str | None, *, delta: bool, first: bool = True
    ) -> dict:
        if not self.chat:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        # A stream names the role in its first delta only, as OpenAI's does.
        message = {"role": "assistant", "content": text} if first else {"content": text}
        key = "delta" if delta else "message"
        return {"index": 0, key: message, "logprobs": None, "finish_reason": finish_reason}

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

    async def whole(self, chunks: AsyncIterator[gen.GenerateResponse]) -> dict:
        """The answer as one object. HttpError when the request fails."""
        parts, finish_reason = [], None
        try:
            async for piece, reason in self.texts(chunks):
                parts.append(piece)
                finish_reason = reason
        except ServiceError as e:
            raise HttpError.from_grpc(e.code, e.message) from None
        choice = self._choice("".join(parts), finish_reason, delta=False)
        answer = self._object([choice], chunk=False)
        return {**answer, "usage": self.usage()}

    async def events(self, chunks: AsyncIterator[gen.GenerateResponse]):
        """The answer as server-sent events, ending with [DONE]. A failure
        after the first event is an event with the error's body."""
        options = self.body.stream_options
        include_usage = bool(options and options.include_usage)
        first = True
        try:
            async for piece, reason in self.texts(chunks):
                choice = self._choice(piece, reason, delta=True, first=first)
                yield _event(self._object([choice], chunk=True))
                first = False
        except ServiceError as e:
            yield _event(HttpError.from_grpc(e.code, e.message).body())
        except Exception as e:  # noqa: BLE001 - the client is told, and the stream ends
            log.exception("front-door stream failed")
            yield _event(HttpError(500, f"internal error: {e}").body())
        if include_usage:
            yield _event({**self._object([], chunk=True), "usage": self.usage()})
        yield DONE


def _event(obj: dict) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"
