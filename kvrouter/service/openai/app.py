"""The front door's endpoints, as a Starlette app: `/v1/completions`,
`/v1/chat/completions`, `/v1/models`, `/health` and `/ready`.

Every request is checked before anything is scheduled (a 400, 404 or 413
with an OpenAI-shaped body), waits for its first chunk before answering so
that a refusal (no routable worker, bad sampling) keeps its status, and
then streams or answers whole. A client that goes away mid-stream closes
the proxied Generate, which cancels the request on its worker (freeing its
blocks) and closes its booking."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kvrouter.frontend import ModelTokenizer
from kvrouter.service.errors import ServiceError
from kvrouter.service.generate import GenerationProxy
from kvrouter.service.openai.completion import Completion
from kvrouter.service.openai.errors import HttpError
from kvrouter.service.openai.requests import (
    DEFAULT_CHAT_MAX_TOKENS,
    DEFAULT_COMPLETION_MAX_TOKENS,
    ChatCompletionRequest,
    CompletionRequest,
)
from kvrouter.service.workers import WorkerTable


class FrontDoor:
    def __init__(
        self,
        generation: GenerationProxy,
        workers: WorkerTable,
        models: dict[str, Path],
        *,
        max_prompt_tokens: int,
        max_requests: int,
    ) -> None:
        self.generation = generation
        self.workers = workers
        self.tokenizers = {name: ModelTokenizer.from_dir(d) for name, d in models.items()}
        self.max_prompt_tokens = max_prompt_tokens
        self.max_requests = max_requests
        self.in_flight = 0
        self.started = int(time.time())
        self.app = Starlette(
            routes=[
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/v1/models", self.list_models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/ready", self.ready, methods=["GET"]),
            ],
            exception_handlers={HttpError: _http_error, HTTPException: _starlette_error},
        )
        # A body may hold the longest prompt as JSON text, several bytes a token.
        self.max_body_bytes = max(1 << 20, 16 * max_prompt_tokens)

    async def health(self, _: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(self, _: Request) -> Response:
        """200 when every served model has a routable worker, else 503."""
        routable = self.workers.models()
        counts = {name: routable.get(name, 0) for name in self.tokenizers}
        ready = all(counts.values())
        return JSONResponse({"ready": ready, "routable_workers": counts}, 200 if ready else 503)

    async def list_models(self, _: Request) -> Response:
        """The served models (and their adapters) that have a routable worker."""
        routable = self.workers.models()
        names = [
            name
            for name, count in routable.items()
            if count and name.partition(":")[0] in self.tokenizers
        ]
        data = [
            {"id": name, "object": "model", "created": self.started, "owned_by": "kvrouter"}
            for name in sorted(names)
        ]
        return JSONResponse({"object": "list", "data": data})

    async def completions(self, request: Request) -> Response:
        body = await self._decode(request, CompletionRequest)
        tokenizer = self._tokenizer(body.model)
        try:
            prompt = body.one_prompt()
        except ValueError as e:
            raise HttpError(400, str(e)) from None
        tokens = await tokenizer.encode_async(prompt) if isinstance(prompt, str) else prompt
        max_tokens = DEFAULT_COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        return await self._answer(
            request, Completion(False, body, tokenizer, list(tokens), max_tokens)
        )

    async def chat_completions(self, request: Request) -> Response:
        body = await self._decode(request, ChatCompletionRequest)
        tokenizer = self._tokenizer(body.model)
        try:
            prompt = await tokenizer.render_and_encode_async(
                body.messages, add_generation_prompt=body.add_generation_prompt, tools=body.tools
            )
        except ValueError as e:
            raise HttpError(400, f"messages: {e}") from None
        max_tokens = next(
            (m for m in (body.max_completion_tokens, body.max_tokens) if m is not None),
            DEFAULT_CHAT_MAX_TOKENS,
        )
        return await self._answer(
            request, Completion(True, body, tokenizer, prompt.token_ids, max_tokens)
        )

    def _tokenizer(self, model: str) -> ModelTokenizer:
        tokenizer = self.tokenizers.get(model.partition(":")[0])
        if tokenizer is None:
            raise HttpError(404, f"the model {model!r} does not exist", code="model_not_found")
        return tokenizer

    async def _decode(self, request: Request, kind: type):
        """The body as `kind`, checked: a 400 naming what is wrong, or a 413
        for a body bigger than the longest prompt the router takes needs."""
        if int(request.headers.get("content-length") or 0) > self.max_body_bytes:
            raise _body_too_big(self.max_body_bytes)
        data = bytearray()
        async for part in request.stream():
            data += part
            if len(data) > self.max_body_bytes:
                raise _body_too_big(self.max_body_bytes)
        try:
            body = msgspec.json.decode(data, type=kind)
        except msgspec.ValidationError as e:
            raise HttpError(400, f"bad request body: {e}") from None
        except msgspec.DecodeError as e:
            raise HttpError(400, f"the body is not JSON: {e}") from None
        try:
            body.check()
        except ValueError as e:
            raise HttpError(400, str(e)) from None
        return body

    async def _answer(self, request: Request, completion: Completion) -> Response:
        _check(completion, self.max_prompt_tokens)
        if self.in_flight >= self.max_requests:
            raise HttpError(
                429, f"{self.in_flight} requests are in flight, the most this router takes"
            )
        self.in_flight += 1
        held = True
        try:
            chunks = await _primed(self.generation.stream(completion.generate_request(), None))
            if not completion.body.stream:
                return JSONResponse(await _unless_gone(request, completion.whole(chunks)))
            held = False
            return StreamingResponse(
                self._releasing(completion.events(chunks)), media_type="text/event-stream"
            )
        finally:
            if held:
                self.in_flight -= 1

    async def _releasing(self, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """`events`, giving the request's slot back when they end."""
        try:
            async with aclosing(events):
                async for event in events:
                    yield event
        finally:
            self.in_flight -= 1


def _check(completion: Completion, max_prompt_tokens: int) -> None:
    if not 1 <= completion.max_tokens < 2**32:
        raise HttpError(400, f"max_tokens must be 1 to 2^32 - 1, not {completion.max_tokens}")
    if not completion.prompt:
        raise HttpError(400, "the prompt is empty")
    if len(completion.prompt) > max_prompt_tokens:
        raise HttpError(
            413,
            f"the prompt has {len(completion.prompt)} tokens; this router takes at most "
            f"{max_prompt_tokens}",
        )


def _body_too_big(limit: int) -> HttpError:
    return HttpError(413, f"the request body is over {limit} bytes")


async def _unless_gone(request: Request, answer):
    """Awaits `answer` unless the client goes away first: then it is
    cancelled (which cancels the request on its worker) and a 499, which
    nobody reads, is raised."""
    task = asyncio.ensure_future(answer)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise HttpError(499, "the client went away")


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _http_error(_: Request, error: HttpError) -> Response:
    return error.response()


async def _starlette_error(_: Request, error: HTTPException) -> Response:
    """Unknown paths and methods, in OpenAI's shape."""
    return HttpError(error.status_code, f"{error.detail}").response()


async def _primed(chunks: AsyncIterator) -> AsyncIterator:
    """`chunks` with its first chunk awaited already, so that a request
    refused before it starts is answered with its status, not a stream."""
    try:
        first = await anext(chunks)
    except StopAsyncIteration:
        first = None
    except ServiceError as e:
        await chunks.aclose()
        raise HttpError.from_grpc(e.code, e.message) from None

    async def replayed():
        async with aclosing(chunks):
            if first is not None:
                yield first
            async for chunk in chunks:
                yield chunk

    return replayed()
