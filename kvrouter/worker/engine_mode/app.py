"""The HTTP routes of a vLLM 0.33 OpenAI server, on the worker's engine:
`POST /v1/completions`, `GET /v1/models`, `GET /health` (503 while the
worker drains) and `GET /metrics`. Requests run on the worker's engine
loop as its gRPC Generate calls do; one whose client goes away is aborted,
which frees its blocks. A request with `kv_transfer_params` (vLLM's) or
`bootstrap_room` (SGLang's) is one half of a split request (handoff.py,
bootstrap.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kvrouter.engine import RequestOutput
from kvrouter.worker.engine_loop import EngineLoop, RequestHandle
from kvrouter.worker.engine_mode.bootstrap import Rooms, ask_prefill
from kvrouter.worker.engine_mode.completions import (
    CompletionRequest,
    Responder,
    error_body,
    parse,
)
from kvrouter.worker.engine_mode.handoff import Handoffs
from kvrouter.worker.engine_mode.metrics import VllmMetrics


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse(error_body(message, status), status_code=status)


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"


class EngineApi:
    def __init__(
        self,
        engine: EngineLoop,
        handoffs: Handoffs,
        model_name: str,
        root: str,
        max_model_len: int,
        block_size: int,
        num_gpu_blocks: int,
    ) -> None:
        self.engine = engine
        self.handoffs = handoffs
        self.rooms = Rooms(handoffs)
        self.model_name = model_name
        self.root = root
        self.max_model_len = max_model_len
        self.metrics = VllmMetrics(model_name, max_model_len, block_size, num_gpu_blocks)
        self.draining = False
        self.created = int(time.time())

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/metrics", self.metrics_page, methods=["GET"]),
                Route("/bootstrap/{room:int}", self.rooms.route, methods=["GET"]),
            ]
        )

    async def health(self, _: Request) -> Response:
        return Response(status_code=503 if self.draining else 200)

    async def metrics_page(self, _: Request) -> Response:
        load = await self.engine.call(lambda engine: engine.load())
        return Response(self.metrics.page(load), media_type=CONTENT_TYPE_LATEST)

    async def models(self, _: Request) -> JSONResponse:
        card = {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": self.root,
            "parent": None,
            "max_model_len": self.max_model_len,
            "permission": [],
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def completions(self, request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return _error("the body is not JSON", 400)
        try:
            completion = parse(body)
        except ValueError as e:
            return _error(str(e), 400)
        model = body.get("model")
        if model is not None and model != self.model_name:
            return _error(f"The model `{model}` does not exist.", 404)
        responder = Responder.for_request(completion, self.model_name)
        hooks = {}
        params = completion.params
        remote = completion.kv_transfer_params if completion.remote_prefill else None
        if completion.remote_decode:
            hooks["on_finish"] = self.handoffs.pin_when_done(responder.id, completion.prompt)
        elif self._bootstrap_side(completion) == "prefill":
            lease = completion.bootstrap.lease
            hooks["on_finish"] = self.handoffs.pin_when_done(lease, completion.prompt)
            params = replace(params, max_tokens=1)
        elif self._bootstrap_side(completion) == "decode":
            remote = await ask_prefill(completion.bootstrap, self.handoffs.fetch_timeout_s)
        if remote is not None:
            unpin = await self.handoffs.fetch(completion.prompt, remote)
            if unpin is not None:
                hooks["on_scheduled"] = unpin
        try:
            handle = await self.engine.add_request(completion.prompt, params, responder.id, **hooks)
        except ValueError as e:
            if "on_scheduled" in hooks:
                self.engine.post(hooks["on_scheduled"])
            if self._bootstrap_side(completion) == "prefill":
                self.rooms.finished(completion.bootstrap, False)
            return _error(str(e), 400)
        outputs = self._outputs(handle, responder.id, completion)
        if completion.stream:
            return StreamingResponse(
                self._stream(responder, handle, outputs), media_type="text/event-stream"
            )
        return await self._whole(request, responder, handle, outputs)

    async def _outputs(
        self, handle: RequestHandle, request_id: str, completion: CompletionRequest
    ) -> AsyncIterator[RequestOutput]:
        """The engine's outputs; aborts the request if they are not read to
        the end, and counts it in the metrics either way."""
        finished = False
        generated = 0
        try:
            while not finished:
                item = await handle.outputs.get()
                if isinstance(item, Exception):
                    raise item
                finished = item.finished
                generated += len(item.new_token_ids)
                yield item
        finally:
            if not finished:
                self.engine.abort(request_id)
            if self._bootstrap_side(completion) == "prefill":
                self.rooms.finished(completion.bootstrap, finished)
            self.metrics.finished(len(completion.prompt), generated)

    async def _stream(
        self, responder: Responder, handle: RequestHandle, outputs: AsyncIterator[RequestOutput]
    ) -> AsyncIterator[str]:
        first = True
        generated = 0
        try:
            async with contextlib.aclosing(outputs):
                async for output in outputs:
                    if not output.new_token_ids and not output.finished:
                        continue
                    generated += len(output.new_token_ids)
                    reason = output.finish_reason if output.finished else None
                    handoff = self._handoff(responder) if output.finished else None
                    chunk = responder.chunk(
                        output.new_token_ids, reason, first, handoff, output.new_logprobs
                    )
                    yield _sse(chunk)
                    first = False
            if responder.request.include_usage:
                yield _sse(responder.usage_chunk(generated, handle.seq.num_cached_tokens))
        except RuntimeError as e:
            # The engine failed, or this request did: vLLM ends the stream with the error.
            yield _sse(error_body(str(e), 500))
        yield "data: [DONE]\n\n"

    async def _whole(
        self,
        request: Request,
        responder: Responder,
        handle: RequestHandle,
        outputs: AsyncIterator[RequestOutput],
    ) -> Response:
        async def collect() -> tuple[list[int], str]:
            tokens: list[int] = []
            reason = ""
            async with contextlib.aclosing(outputs):
                async for output in outputs:
                    tokens.extend(output.new_token_ids)
                    reason = output.finish_reason or reason
            return tokens, reason

        task = asyncio.ensure_future(collect())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not task.done():
            # The client went away: cancelling the collection aborts the request.
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return _error("Client disconnected", 499)
        try:
            tokens, reason = task.result()
        except RuntimeError as e:
            return _error(str(e), 500)
        seq = handle.seq
        answer = responder.response(
            tokens, reason, seq.num_cached_tokens, self._handoff(responder), seq.output_logprobs
        )
        return JSONResponse(answer)

    def _bootstrap_side(self, completion: CompletionRequest) -> str | None:
        """The part of an SGLang split this worker plays in the request: its
        role's ("prefill" or "decode"); None outside a split or as "both"."""
        if completion.bootstrap is None or self.handoffs.identity.role == "both":
            return None
        return self.handoffs.identity.role

    def _handoff(self, responder: Responder) -> dict | None:
        """A finished prefill's kv_transfer_params for its decode worker."""
        if not responder.request.remote_decode:
            return None
        return self.handoffs.answer(responder.id)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
