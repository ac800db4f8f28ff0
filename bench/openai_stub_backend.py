"""A trivial OpenAI-compatible backend for measuring routers: no model, every
request is answered at once with N tokens (the request's `max_tokens`, or
`--tokens`), streamed (SSE, one event a token, then `data: [DONE]`) or whole.

`POST /v1/completions` and `/v1/chat/completions`, `GET /health` and
`/v1/models`. Each choice carries `token_ids` (vLLM's `return_token_ids:
true` shape), so a router that sends token ids and detokenizes what comes
back can use it as a worker.

It must cost the routers in front of it nothing measurable: asyncio with
uvloop and httptools' parser, no framework, answers built once per
(endpoint, stream, tokens, model, usage) and reused, and `--processes`
copies sharing the port through SO_REUSEPORT. A response is written whole
with a Content-Length, as a backend that had all its tokens would.

    python bench/openai_stub_backend.py --port 8100 --processes 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import signal
import socket

import httptools
import msgspec
import uvloop

DEFAULT_TOKENS = 16
# The text of every generated token; its id is `--token-id`, which a router
# that detokenizes must read as this text.
TOKEN_TEXT = "x"
CREATED = 1_700_000_000


class Request(msgspec.Struct):
    model: str = ""
    stream: bool = False
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream_options: dict | None = None


def _chunk(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def completion_body(
    chat: bool, stream: bool, tokens: int, model: str, usage: bool, token_id: int
) -> bytes:
    """The whole response body: SSE events when `stream`, else one JSON object."""
    kind = "chat.completion" if chat else "text_completion"
    head = {"id": "cmpl-stub", "created": CREATED, "model": model}
    counts = {"prompt_tokens": 0, "completion_tokens": tokens, "total_tokens": tokens}
    if not stream:
        if chat:
            choice = {"message": {"role": "assistant", "content": TOKEN_TEXT * tokens}}
        else:
            choice = {"text": TOKEN_TEXT * tokens}
        choice |= {"index": 0, "finish_reason": "length", "token_ids": [token_id] * tokens}
        return json.dumps({**head, "object": kind, "choices": [choice], "usage": counts}).encode()
    kind += ".chunk" if chat else ""
    events = []
    for i in range(tokens):
        piece = {"delta": {"content": TOKEN_TEXT}} if chat else {"text": TOKEN_TEXT}
        if chat and i == 0:
            piece["delta"]["role"] = "assistant"
        finish = "length" if i == tokens - 1 else None
        choice = {"index": 0, **piece, "finish_reason": finish, "token_ids": [token_id]}
        events.append(_chunk({**head, "object": kind, "choices": [choice]}))
    if usage:
        events.append(_chunk({**head, "object": kind, "choices": [], "usage": counts}))
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)


def _response(status: str, content_type: bytes, body: bytes) -> bytes:
    return b"".join(
        (
            f"HTTP/1.1 {status}\r\n".encode(),
            b"content-type: ",
            content_type,
            f"\r\ncontent-length: {len(body)}\r\n\r\n".encode(),
            body,
        )
    )


def _json_response(status: str, obj: dict) -> bytes:
    return _response(status, b"application/json", json.dumps(obj).encode())


class Backend:
    """The answers, built once each."""

    def __init__(self, default_tokens: int, token_id: int) -> None:
        self.default_tokens = default_tokens
        self.token_id = token_id
        self.answers: dict[tuple, bytes] = {}
        self.health = _json_response("200 OK", {"status": "ok"})
        self.models = _json_response(
            "200 OK",
            {"object": "list", "data": [{"id": "stub", "object": "model", "owned_by": "stub"}]},
        )
        self.not_found = _json_response("404 Not Found", {"error": {"message": "no such path"}})

    def answer(self, method: bytes, path: bytes, body: bytes) -> bytes:
        if method == b"GET":
            if path == b"/health":
                return self.health
            if path == b"/v1/models":
                return self.models
            return self.not_found
        chat = path == b"/v1/chat/completions"
        if not chat and path != b"/v1/completions":
            return self.not_found
        try:
            request = msgspec.json.decode(body, type=Request)
        except msgspec.MsgspecError as e:
            return _json_response("400 Bad Request", {"error": {"message": str(e)}})
        tokens = request.max_completion_tokens or request.max_tokens or self.default_tokens
        usage = bool((request.stream_options or {}).get("include_usage"))
        key = (chat, request.stream, tokens, request.model, usage)
        answer = self.answers.get(key)
        if answer is None:
            body = completion_body(
                chat, request.stream, tokens, request.model, usage, self.token_id
            )
            kind = b"text/event-stream" if request.stream else b"application/json"
            answer = self.answers[key] = _response("200 OK", kind, body)
        return answer


class Connection(asyncio.Protocol):
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.write(_json_response("400 Bad Request", {"error": {"message": "bad"}}))
            self.transport.close()

    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        path = self.url.partition(b"?")[0]
        self.transport.write(
            self.backend.answer(self.parser.get_method(), path, b"".join(self.body))
        )
        if not self.parser.should_keep_alive():
            self.transport.close()


def _listening_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(4096)
    return sock


async def _serve(host: str, port: int, backend: Backend) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = await loop.create_server(
        lambda: Connection(backend), sock=_listening_socket(host, port)
    )
    async with server:
        await stop.wait()


def serve(host: str, port: int, backend: Backend) -> None:
    uvloop.run(_serve(host, port, backend))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--tokens", type=int, default=DEFAULT_TOKENS, help="tokens when max_tokens is absent"
    )
    parser.add_argument(
        "--token-id", type=int, default=0, help=f"the id of each token, read as {TOKEN_TEXT!r}"
    )
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args()
    backend = Backend(args.tokens, args.token_id)
    workers = [
        multiprocessing.Process(target=serve, args=(args.host, args.port, backend))
        for _ in range(args.processes - 1)
    ]
    for worker in workers:
        worker.start()
    try:
        serve(args.host, args.port, backend)
    finally:
        for worker in workers:
            worker.terminate()
            worker.join()


if __name__ == "__main__":
    main()
