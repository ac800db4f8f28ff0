"""The front door's endpoints, served by `kvrouter.net.http1_server` through
its route table (routes.py): `/v1/completions`,
`/v1/chat/completions`, `/v1/models`, `/health` and `/ready`.

Every request is checked before anything is scheduled (a 400, 404 or 413
with an OpenAI-shaped body), is admitted (`admission.Admission`: it may
wait, or be refused with 429 or 503), waits for its first chunk before answering so
that a refusal (no routable worker, bad sampling) keeps its status, and
then streams or answers whole. A client that goes away mid-stream closes
the proxied Generate, which cancels the request on its worker (freeing its
blocks) and closes its booking."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import msgspec
from prometheus_client import CollectorRegistry

from kvrouter.frontend import ModelTokenizer
from kvrouter.net.http1_server import Answer, EventStream, Request
from kvrouter.policy import UnknownModel
from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.service.config import ServiceConfig
from kvrouter.service.errors import ServiceError
from kvrouter.service.generate import GenerationProxy
from kvrouter.service.openai.admission import PRIORITY_HEADER, Admission, Priority
from kvrouter.service.openai.completion import Chunks, Completion
from kvrouter.service.openai.errors import HttpError
from kvrouter.service.openai.observed import FrontDoorMetrics, RequestRecord
from kvrouter.service.openai.requests import (
    DEFAULT_CHAT_MAX_TOKENS,
    DEFAULT_COMPLETION_MAX_TOKENS,
    ChatCompletionRequest,
    CompletionRequest,
)
from kvrouter.service.openai.routes import Routes, answer, body_too_big, read_body
from kvrouter.service.openai.session import SESSION_HEADER, session_id
from kvrouter.service.workers import WorkerTable


class FrontDoor:
    def __init__(
        self,
        generation: GenerationProxy,
        workers: WorkerTable,
        models: dict[str, Path],
        config: ServiceConfig,
        registry: CollectorRegistry,
    ) -> None:
        self.generation = generation
        self.workers = workers
        self.tokenizers = {
            name: ModelTokenizer.from_dir(d, cache_tokens=config.http_tokenizer_cache_tokens)
            for name, d in models.items()
        }
        self.max_prompt_tokens = config.max_prompt_tokens
        self.body_timeout_s = config.http_body_timeout_s
        self.metrics = FrontDoorMetrics(registry)
        self.admission = Admission(
            generation.ctx.policy.backlog_ms,
            max_in_flight=config.http_max_requests,
            max_backlog_ms=config.http_max_backlog_ms,
            max_queued=config.http_max_queued,
            queue_timeout_s=config.http_queue_timeout_s,
            on_depth=lambda model, priority, depth: self.metrics.queue_depth.labels(
                model, priority.value
            ).set(depth),
        )
        self.started = int(time.time())
        self.app = Routes(
            {
                ("POST", "/v1/completions"): self.completions,
                ("POST", "/v1/chat/completions"): self.chat_completions,
                ("GET", "/v1/models"): self.list_models,
                ("GET", "/health"): self.health,
                ("GET", "/ready"): self.ready,
            }
        )
        # A body may hold the longest prompt as JSON text, several bytes a token.
        self.max_body_bytes = max(1 << 20, 16 * config.max_prompt_tokens)

    async def health(self, _: Request) -> Answer:
        return answer({"status": "ok"})

    async def ready(self, _: Request) -> Answer:
        """200 when every served model has a routable worker, else 503."""
        routable = self.workers.models()
        # A served model's name listed for another model's adapter counts none.
        counts = {
            name: routable.get(name, 0) if self._model(name) == name else 0
            for name in self.tokenizers
        }
        ready = all(counts.values())
        return answer({"ready": ready, "routable_workers": counts}, 200 if ready else 503)

    async def list_models(self, _: Request) -> Answer:
        """The served models (and their adapters) that have a routable worker."""
        routable = self.workers.models()
        names = [name for name, count in routable.items() if count and self._model(name)]
        data = [
            {"id": name, "object": "model", "created": self.started, "owned_by": "kvrouter"}
            for name in sorted(names)
        ]
        return answer({"object": "list", "data": data})

    async def completions(self, request: Request) -> Answer | EventStream:
        return await self._serve(request, RequestRecord("/v1/completions"), self._completion)

    async def chat_completions(self, request: Request) -> Answer | EventStream:
        return await self._serve(request, RequestRecord("/v1/chat/completions"), self._chat)

    async def _completion(self, request: Request, record: RequestRecord) -> Completion:
        body = await self._decode(request, CompletionRequest)
        model, tokenizer = self._tokenizer(body.model, record)
        try:
            prompt = body.one_prompt()
        except ValueError as e:
            raise HttpError(400, str(e)) from None
        tokens = await tokenizer.encode_async(prompt) if isinstance(prompt, str) else prompt
        max_tokens = DEFAULT_COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        return Completion(False, body, tokenizer, tokens, max_tokens, record, model)

    async def _chat(self, request: Request, record: RequestRecord) -> Completion:
        body = await self._decode(request, ChatCompletionRequest)
        model, tokenizer = self._tokenizer(body.model, record)
        try:
            prompt = await tokenizer.render_and_encode_async(
                body.messages, add_generation_prompt=body.add_generation_prompt, tools=body.tools
            )
        except ValueError as e:
            raise HttpError(400, f"messages: {e}") from None
        asked = next(
            (m for m in (body.max_completion_tokens, body.max_tokens) if m is not None), None
        )
        if asked is None:
            # Up to the end of the context, as vLLM's default, within a bound.
            room = _room(tokenizer, len(prompt.token_ids))
            asked = DEFAULT_CHAT_MAX_TOKENS if room is None else min(DEFAULT_CHAT_MAX_TOKENS, room)
        return Completion(True, body, tokenizer, prompt.token_ids, asked, record, model)

    def _model(self, model: str) -> str | None:
        """The name a request's `model` is routed under: a served model's
        own, or `model:adapter` for an adapter named by itself where one
        model has it; None when it is no served model's. A served model's
        name never stands for another model's adapter, even while none of
        its workers is up. An adapter several models have is a 404 naming
        them."""
        try:
            routed = self.workers.canonical_model(model)
        except UnknownModel as e:
            if model in self.tokenizers:
                return None
            raise HttpError(404, str(e), code="model_not_found") from None
        if model in self.tokenizers and routed != model:
            return None
        return routed if routed.partition(":")[0] in self.tokenizers else None

    def _tokenizer(self, model: str, record: RequestRecord) -> tuple[str, ModelTokenizer]:
        """The name `model` is routed under (`_model`), and its tokenizer."""
        routed = self._model(model)
        if routed is None:
            raise HttpError(404, f"the model {model!r} does not exist", code="model_not_found")
        record.model = model
        return routed, self.tokenizers[routed.partition(":")[0]]

    async def _decode(self, request: Request, kind: type):
        """The body as `kind`, checked: a 400 naming what is wrong, a 413
        for a body bigger than the longest prompt the router takes needs,
        or a 408 for one that takes longer than `body_timeout_s` to come."""
        if int(request.headers.get("content-length") or 0) > self.max_body_bytes:
            raise body_too_big(self.max_body_bytes)
        data = await read_body(request, self.max_body_bytes, self.body_timeout_s)
        try:
            body = kind.decode(data)
        except msgspec.ValidationError as e:
            raise HttpError(400, f"bad request body: {e}") from None
        except msgspec.DecodeError as e:
            raise HttpError(400, f"the body is not JSON: {e}") from None
        try:
            body.check()
        except ValueError as e:
            raise HttpError(400, str(e)) from None
        return body

    async def _serve(self, request: Request, record: RequestRecord, build) -> Answer | EventStream:
        """Runs `build`'s completion: checked, admitted, dispatched, then
        answered whole or streamed. The request is counted and logged once,
        here or when its stream ends, and its admission given back."""
        admitted = streaming = False
        try:
            priority = Priority.from_header(request.headers.get(PRIORITY_HEADER))
            record.priority = priority.value
            completion = await build(request, record)
            completion.session = session_id(
                request.headers.get(SESSION_HEADER), completion.body.user
            )
            _check(completion, self.max_prompt_tokens)
            record.queue_s = await self.admission.admit(completion.model, priority)
            admitted = True
            self.metrics.queued(record)
            chunks = self.generation.stream(
                completion.generate_request(), None, prompt=completion.prompt
            )
            first = await _first(chunks)
            headers = {"x-request-id": completion.id}
            if not completion.body.stream:
                whole = await _unless_gone(request, completion.whole(first, chunks))
                return answer(whole, headers=headers)
            streaming = True
            events = completion.events(first, chunks)
            return EventStream(events, headers, on_end=lambda: self._stream_ended(record))
        except HttpError as e:
            record.failed(e.status, e.message)
            raise
        except Exception as e:
            record.failed(500, f"internal error: {e}")
            raise
        finally:
            if not streaming:
                if admitted:
                    self.admission.release()
                self.metrics.done(record)

    def _stream_ended(self, record: RequestRecord) -> None:
        """A stream is over: the admission is given back and the request
        counted (a stream the client left is a 499)."""
        if record.finish_reason is None and record.error is None:
            record.failed(499, "the client went away")
        self.admission.release()
        self.metrics.done(record)

    async def close(self) -> None:
        await self.admission.close()


def _room(tokenizer: ModelTokenizer, prompt_tokens: int) -> int | None:
    """Tokens left in the model's context after the prompt; None: unknown."""
    if tokenizer.max_model_len is None:
        return None
    return max(0, tokenizer.max_model_len - prompt_tokens)


def _check(completion: Completion, max_prompt_tokens: int) -> None:
    prompt = len(completion.prompt)
    if not prompt:
        raise HttpError(400, "the prompt is empty")
    limit = min(max_prompt_tokens, completion.tokenizer.max_model_len or max_prompt_tokens)
    if prompt > limit:
        raise HttpError(413, f"the prompt has {prompt} tokens; this model takes at most {limit}")
    if not 1 <= completion.max_tokens < 2**32:
        raise HttpError(400, f"max_tokens must be 1 to 2^32 - 1, not {completion.max_tokens}")
    room = _room(completion.tokenizer, prompt)
    if room is not None and completion.max_tokens > room:
        raise HttpError(
            400,
            f"this model's context is {completion.tokenizer.max_model_len} tokens; the prompt "
            f"has {prompt}, so max_tokens can be at most {room}, not {completion.max_tokens}",
        )


async def _unless_gone(request: Request, whole):
    """Awaits `whole` unless the client goes away first: then it is
    cancelled (which cancels the request on its worker) and a 499, which
    nobody reads, is raised."""
    task = asyncio.ensure_future(whole)
    gone = asyncio.ensure_future(request.disconnected())
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


async def _first(chunks: Chunks) -> gen.GenerateResponse | None:
    """The first chunk (None: there is none), awaited before answering so
    that a request refused before it starts is answered with its status,
    not a stream."""
    try:
        return await anext(chunks)
    except StopAsyncIteration:
        return None
    except ServiceError as e:
        await chunks.aclose()
        raise HttpError.from_grpc(e.code, e.message) from None
