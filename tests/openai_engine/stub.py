"""An OpenAI-compatible engine for tests, serving `/v1/completions` for
real on 127.0.0.1 (uvicorn, Starlette), on a loop and thread of its own. It
streams its `tokens` as vLLM does with `return_token_ids`: one choice per
token with `token_ids` (the first with the prompt's `prompt_token_ids`), a
last choice with the finish reason, a usage summary, then [DONE]. It
records every body it receives, and can be told to fail: `mode`
"unavailable" (503 before any token), "refuse" (400), "drop" (the
connection cut after two tokens), "hang" (headers, then nothing) or "hold"
(one token, then nothing until the client leaves); "one_event" streams
every token in one choice, as an engine that has fallen behind its client
does.

Asked for `logprobs`, each choice carries them as vLLM's do with
`return_tokens_as_token_ids` (token i's log probability is -(i + 1) / 10,
with no other token more likely), unless `mode` is "no_logprobs".

A request with `"stream": false` gets the whole answer at once; one with
vLLM's `kv_transfer_params.do_remote_decode` (a prefill for a decode
elsewhere) gets `kv_transfer_params` pointing D at this stub, unless
`mode` is "no_params". `request_ids` records each request's X-Request-Id.

SGLang's bootstrap: a prefill stub (`bootstrap_port` set) notes the
`bootstrap_room` of each request it answers; a decode stub given that
stub as its `prefill` refuses a request whose bootstrap fields do not name
it, and sends no token until the prefill stub has seen the room."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from kvrouter.client import WorkerLoad
from kvrouter.net.http_server import HttpServer


class StubEngine:
    def __init__(
        self, tokens: list[int], bootstrap_port: int = 0, prefill: StubEngine | None = None
    ) -> None:
        self.tokens = tokens
        self.bootstrap_port = bootstrap_port
        self.prefill = prefill
        # The bootstrap rooms this (prefill) stub has done its part for.
        self.rooms: set[int] = set()
        self.mode = "ok"
        self.received: list[dict] = []
        # The client address (host, port) of each request.
        self.peers: list[tuple[str, int]] = []
        self.request_ids: list[str] = []
        # Each request's X-data-parallel-rank header ("" when absent).
        self.dp_ranks: list[str] = []
        # Streams that ended with the client gone before the last event.
        self.disconnects = 0
        # What its registration's heartbeats report.
        self.load = WorkerLoad()
        self._loop = asyncio.new_event_loop()
        app = Starlette(routes=[Route("/v1/completions", self._complete, methods=["POST"])])
        self._server = HttpServer(app, "127.0.0.1:0")
        # Each event goes out as it is written, as a real engine's do.
        self._server.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.url = f"http://127.0.0.1:{self._server.port}"
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def reset(self) -> None:
        """Answering again, with nothing recorded."""
        self.mode = "ok"
        self.received.clear()
        self.request_ids.clear()
        self.disconnects = 0

    def start(self) -> StubEngine:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._server.start(), self._loop).result(30)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._server.stop(1.0), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    async def _complete(self, request: Request):
        body = await request.json()
        self.received.append(body)
        self.peers.append(tuple(request.client))
        self.request_ids.append(request.headers.get("x-request-id", ""))
        self.dp_ranks.append(request.headers.get("x-data-parallel-rank", ""))
        if self.mode == "unavailable":
            error = {"error": {"message": "the engine is overloaded", "code": 503}}
            return JSONResponse(error, status_code=503)
        if self.mode == "refuse":
            error = {"error": {"message": "max_tokens is too large", "code": 400}}
            return JSONResponse(error, status_code=400)
        if self.prefill is not None and "bootstrap_room" in body:
            expected = ("127.0.0.1", self.prefill.bootstrap_port)
            if (body.get("bootstrap_host"), body.get("bootstrap_port")) != expected:
                error = {"error": {"message": "not the prefill's bootstrap address", "code": 400}}
                return JSONResponse(error, status_code=400)
        if body.get("stream") is False:
            return await self._whole(body)
        return StreamingResponse(self._events(body), media_type="text/event-stream")

    async def _whole(self, body: dict) -> JSONResponse:
        if self.mode in ("hang", "hold"):
            await asyncio.Event().wait()
        if "bootstrap_room" in body:
            self.rooms.add(body["bootstrap_room"])
        tokens = self.tokens[: body["max_tokens"]]
        reason = "length" if len(tokens) == body["max_tokens"] else "stop"
        answer = {**_chunk(body, tokens, reason), "kv_transfer_params": None}
        asked = body.get("kv_transfer_params") or {}
        if asked.get("do_remote_decode") and self.mode != "no_params":
            answer["kv_transfer_params"] = self.handed_off()
        return JSONResponse(answer)

    def handed_off(self) -> dict:
        """What this stub answers a prefill for a remote decode with."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": f"stub-{self._server.port}",
            "remote_block_ids": [7, 8, 9],
            "remote_host": "127.0.0.1",
            "remote_port": self._server.port,
            "tp_size": 1,
        }

    async def _events(self, body: dict):
        mode, finished = self.mode, False
        try:
            if mode == "hang":
                await asyncio.Event().wait()
            if self.prefill is not None and "bootstrap_room" in body:
                # The prefill stub runs on a loop of its own: its rooms are polled.
                while body["bootstrap_room"] not in self.prefill.rooms:
                    await asyncio.sleep(0.01)
            count = min(body["max_tokens"], len(self.tokens))
            per_event = count if mode == "one_event" else 1
            for i in range(0, count, per_event):
                if mode == "drop" and i == 2:
                    raise ConnectionAbortedError("the stub cuts the connection")
                chunk = _chunk(body, self.tokens[i : i + per_event], None)
                if body.get("logprobs") is not None and mode != "no_logprobs":
                    chunk["choices"][0]["logprobs"] = _logprobs(self.tokens, i, i + per_event)
                if i == 0:
                    # As vLLM does: the prompt's ids, once, in the first choice.
                    chunk["choices"][0]["prompt_token_ids"] = body["prompt"]
                yield _event(chunk)
                if mode == "hold":
                    await asyncio.Event().wait()
            reason = "length" if count == body["max_tokens"] else "stop"
            yield _event(_chunk(body, [], reason))
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": count}
            yield _event({**_chunk(body, [], None), "choices": [], "usage": usage})
            yield b"data: [DONE]\n\n"
            finished = True
        finally:
            if not finished and mode != "drop":
                self.disconnects += 1


def _logprobs(tokens: list[int], start: int, end: int) -> dict:
    """vLLM's completion logprobs of tokens[start:end], named by id."""
    names = [f"token_id:{t}" for t in tokens[start:end]]
    values = [-(i + 1) / 10 for i in range(start, end)]
    return {
        "text_offset": [0] * len(names),
        "token_logprobs": values,
        "tokens": names,
        "top_logprobs": [{name: v} for name, v in zip(names, values, strict=True)],
    }


def _chunk(body: dict, tokens: list[int], finish_reason: str | None) -> dict:
    choice = {"index": 0, "text": "", "token_ids": tokens, "finish_reason": finish_reason}
    return {
        "id": "cmpl-stub",
        "object": "text_completion",
        "model": body["model"],
        "choices": [choice],
    }


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"
