"""The front door's ASGI plumbing, on uvicorn with no framework between:
a route table, the request's headers and body, and the three ways an
answer goes out (a JSON body, an error, a stream of server-sent events).

A framework's layers (middleware, routing objects, a task group per
streamed response) cost a third of the front door's event-loop time per
request; these few functions are all the front door uses of one.

A stream watches for the client leaving: when it does, the task producing
the events is cancelled, which closes the proxied Generate and so cancels
the request on its worker."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec

from kvrouter.service.openai.errors import HttpError

JSON = b"application/json"
EVENT_STREAM = b"text/event-stream"
log = logging.getLogger("kvrouter.service.openai")


class Request:
    """One HTTP request: its headers (names lowercased) and its body."""

    __slots__ = ("headers", "receive")

    def __init__(self, scope: dict, receive: Callable[[], Awaitable[dict]]) -> None:
        self.headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        self.receive = receive

    async def body(self, limit: int) -> bytes:
        """The whole body; HttpError 413 past `limit` bytes, 499 when the
        client leaves before it is sent."""
        data = bytearray()
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise HttpError(499, "the client went away")
            data += message.get("body", b"")
            if len(data) > limit:
                raise body_too_big(limit)
            if not message.get("more_body", False):
                return bytes(data)

    async def disconnected(self) -> None:
        """Returns when the client has gone (the body read already)."""
        while (await self.receive())["type"] != "http.disconnect":
            pass


def body_too_big(limit: int) -> HttpError:
    return HttpError(413, f"the request body is over {limit} bytes")


class Answer:
    """A whole answer: a JSON body (bytes, or an object to encode)."""

    __slots__ = ("status", "body", "headers")

    def __init__(self, body, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.body = body if isinstance(body, bytes) else msgspec.json.encode(body)
        self.status = status
        self.headers = headers or {}

    async def send(self, send: Callable[[dict], Awaitable[None]]) -> None:
        await _start(send, self.status, JSON, self.headers, len(self.body))
        await send({"type": "http.response.body", "body": self.body})


def error_answer(error: HttpError) -> Answer:
    return Answer(error.body(), error.status, error.headers())


class EventStream:
    """Server-sent events, each already encoded, sent as they come."""

    __slots__ = ("events", "headers")

    def __init__(self, events: AsyncIterator[bytes], headers: dict[str, str]) -> None:
        self.events = events
        self.headers = headers

    async def send(self, send: Callable[[dict], Awaitable[None]], request: Request) -> None:
        await _start(send, 200, EVENT_STREAM, {**self.headers, "cache-control": "no-cache"})
        producer = asyncio.current_task()
        streamed = False
        gone = asyncio.ensure_future(request.disconnected())
        gone.add_done_callback(lambda _: None if streamed else producer.cancel())
        try:
            async with contextlib.aclosing(self.events):
                async for event in self.events:
                    await send({"type": "http.response.body", "body": event, "more_body": True})
            streamed = True
            await send({"type": "http.response.body", "body": b""})
        except asyncio.CancelledError:
            if not gone.done() or gone.cancelled():
                raise
            # The client left: the stream ends here, with nobody to read more.
            producer.uncancel()
        finally:
            streamed = True
            gone.cancel()


async def _start(send, status: int, media_type: bytes, headers: dict[str, str], length=None):
    raw = [(b"content-type", media_type)]
    if length is not None:
        raw.append((b"content-length", str(length).encode()))
    raw += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})


Handler = Callable[[Request], Awaitable["Answer | EventStream"]]


class Routes:
    """An ASGI app: (method, path) to a handler; an unknown path is a 404 and
    a known path asked with another method a 405, both in OpenAI's shape."""

    def __init__(self, routes: dict[tuple[str, str], Handler]) -> None:
        self.routes = routes
        self.paths = {path for _, path in routes}

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http":
            return  # lifespan is off; websockets are not served
        handler = self.routes.get((scope["method"], scope["path"]))
        request = Request(scope, receive)
        try:
            if handler is None:
                raise (
                    HttpError(405, "Method Not Allowed")
                    if scope["path"] in self.paths
                    else HttpError(404, "Not Found")
                )
            answer = await handler(request)
        except HttpError as e:
            answer = error_answer(e)
        except Exception as e:  # noqa: BLE001 - the client is answered; the log has the trace
            log.exception("front-door request failed")
            answer = error_answer(HttpError(500, f"internal error: {e}"))
        if isinstance(answer, EventStream):
            await answer.send(send, request)
        else:
            await answer.send(send)
