"""The front door's HTTP/1.1 server: asyncio protocols on the caller's own
event loop, httptools' parser (the one uvicorn uses), and no ASGI between.

Why not uvicorn, which the worker's engine-compatible API still serves with
(`http_server.py`, for its Starlette app): its per-request machinery (the
ASGI scope and message dicts, a response cycle object, the checks of every
`send`) was a fifth of the front door's event-loop time per request against
an engine that costs nothing. This is the part the front door needs: parse a
request, hand it to one handler, write its answer whole or as a stream.

The contract with the handler (`Handler`): it is called once per request
when the request's headers have arrived, reads the body with
`Request.body`, and returns an `Answer` (written whole, with a
Content-Length) or an `EventStream` (written as it is produced, chunked).
A client that goes away mid-stream cancels the task producing the events;
an `EventStream`'s iterator is closed either way, and its `on_end` called.

Connections are kept alive (HTTP/1.1's default) and closed after
`keep_alive_s` idle; pipelined requests are answered in order, one at a
time. A request that does not parse gets a 400, one whose headers exceed
`MAX_HEADER_BYTES` a 431, and one whose headers are not all in within
`keep_alive_s` of the connection going idle a 408 (a client trickling its
headers holds no connection for longer); each closes its connection."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus

import httptools

from kvrouter.net.addresses import http_listening_socket
from kvrouter.net.lazy_timer import LazyTimer

log = logging.getLogger("kvrouter.net.http")

KEEP_ALIVE_S = 5.0
MAX_HEADER_BYTES = 64 << 10
JSON = b"application/json"
EVENT_STREAM = b"text/event-stream"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus}


class ClientGone(Exception):
    """The client closed its connection before its request was answered."""


class BodyTooBig(Exception):
    """The body is longer than the limit its reader set."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is over {limit} bytes")
        self.limit = limit


class Request:
    """One request: its method, path, query, headers (names lowercased, one
    value each: the last) and its body as it arrives."""

    __slots__ = (
        "method",
        "path",
        "query",
        "headers",
        "keep_alive",
        "http_10",
        "_parts",
        "_size",
        "_complete",
        "_gone",
        "_waiter",
        "_connection",
    )

    def __init__(self, connection: _Connection, method: str, url: bytes, headers: dict) -> None:
        path, _, query = url.partition(b"?")
        self.method = method
        self.path = path.decode("latin-1")
        self.query = query.decode("latin-1")
        self.headers = headers
        self.keep_alive = True
        self.http_10 = False
        self._parts: list[bytes] = []
        self._size = 0
        self._complete = False
        self._gone = False
        self._waiter: asyncio.Future | None = None
        self._connection = connection

    async def body(self, limit: int, timeout_s: float) -> bytes:
        """The whole body. BodyTooBig past `limit` bytes, ClientGone when the
        client leaves before it is sent, TimeoutError when it is not all in
        within `timeout_s`."""
        if not self._complete:
            if self.headers.get("expect", "").lower() == "100-continue":
                self._connection.write(CONTINUE)
            timer = self._connection.timer
            timer.arm(timeout_s)
            try:
                while not self._complete:
                    if self._size > limit:
                        raise BodyTooBig(limit)
                    if self._gone:
                        raise ClientGone()
                    await self._wait()
            finally:
                timer.disarm()
        if self._size > limit:
            raise BodyTooBig(limit)
        return b"".join(self._parts) if len(self._parts) != 1 else self._parts[0]

    async def disconnected(self) -> None:
        """Returns when the client has gone."""
        while not self._gone:
            await self._wait()

    @property
    def gone(self) -> bool:
        return self._gone

    @property
    def incomplete(self) -> bool:
        return not self._complete

    async def _wait(self) -> None:
        self._waiter = self._connection.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _time_out(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(TimeoutError())

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _feed(self, data: bytes) -> None:
        self._size += len(data)
        self._parts.append(data)
        self._wake()

    def _ended(self) -> None:
        self._complete = True
        self._wake()

    def _lost(self) -> None:
        self._gone = True
        self._wake()


class Answer:
    """A whole answer: a JSON body (bytes), its status and extra headers."""

    __slots__ = ("status", "body", "headers", "media_type")

    def __init__(
        self,
        body: bytes,
        status: int = 200,
        headers: dict[str, str] | None = None,
        media_type: bytes = JSON,
    ) -> None:
        self.body = body
        self.status = status
        self.headers = headers or {}
        self.media_type = media_type


class EventStream:
    """Server-sent events, each already encoded, sent as they come.
    `on_end` is called once the stream is over (written, or its client
    gone), after its iterator is closed."""

    __slots__ = ("events", "headers", "on_end")

    def __init__(
        self,
        events: AsyncIterator[bytes],
        headers: dict[str, str],
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self.events = events
        self.headers = headers
        self.on_end = on_end


Handler = Callable[[Request], Awaitable["Answer | EventStream"]]


def _head(
    status: int, media_type: bytes, headers: dict[str, str], length: int | None, close: bool
) -> bytes:
    """The status line and headers; `length` None: chunked, unless `close`
    (an HTTP/1.0 client's stream ends where its connection does)."""
    lines = [_STATUS_LINES.get(status) or f"HTTP/1.1 {status} Unknown\r\n".encode()]
    lines.append(b"content-type: " + media_type + b"\r\n")
    if length is not None:
        lines.append(b"content-length: %d\r\n" % length)
    elif not close:
        lines.append(b"transfer-encoding: chunked\r\n")
    if close:
        lines.append(b"connection: close\r\n")
    for name, value in headers.items():
        lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    lines.append(b"\r\n")
    return b"".join(lines)


def _error_body(message: str, kind: str = "server_error") -> bytes:
    """An error in OpenAI's shape, for what fails before the handler can answer."""
    error = {"message": message, "type": kind, "param": None, "code": None}
    return json.dumps({"error": error}).encode()


def _plain(status: int, message: str) -> bytes:
    body = _error_body(message, "invalid_request_error")
    return _head(status, JSON, {}, len(body), close=True) + body


class _Connection(asyncio.Protocol):
    """One client connection: its parser, the request being parsed, those
    waiting their turn, and the one being answered."""

    def __init__(self, server: Http1Server, loop: asyncio.AbstractEventLoop) -> None:
        self.server = server
        self.loop = loop
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[str, str] = {}
        self.header_bytes = 0
        self.parsing: Request | None = None
        self.waiting: collections.deque[Request] = collections.deque()
        self.answering: asyncio.Task | None = None
        self.answered: Request | None = None
        self.streaming = False
        # The keep-alive time while idle, or the body's time while it is awaited.
        self.timer = LazyTimer(loop, self._timed_out)
        self.drained: asyncio.Future | None = None
        self.closing = False
        self.receiving_head = False
        self.out: list[bytes] = []

    # -- asyncio.Protocol

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.server._connections.add(self)
        self._arm_idle()

    def connection_lost(self, exc) -> None:
        self.closing = True
        self.server._connections.discard(self)
        self.timer.close()
        for request in (self.answered, self.parsing, *self.waiting):
            if request is not None:
                request._lost()
        if self.answering is not None and self.streaming:
            # Nobody reads the rest: the producer is cancelled where it waits.
            self.answering.cancel()
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not served")
        except httptools.HttpParserError as e:
            self._refuse(400, f"the request does not parse: {e}")

    def pause_writing(self) -> None:
        self.drained = self.loop.create_future()

    def resume_writing(self) -> None:
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self.drained = None

    # -- httptools

    def on_message_begin(self) -> None:
        # The keep-alive time runs on until the headers are in.
        self.receiving_head = True
        self.url = b""
        self.headers = {}
        self.header_bytes = 0

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.header_bytes += len(url)
        if self.header_bytes > MAX_HEADER_BYTES:
            self._refuse(414, "the request's URL is too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value)
        if self.header_bytes > MAX_HEADER_BYTES:
            self._refuse(431, "the request's headers are too large")
            return
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.receiving_head = False
        self.timer.disarm()
        if self.closing:
            return
        method = self.parser.get_method().decode("latin-1")
        request = Request(self, method, self.url, self.headers)
        request.keep_alive = self.parser.should_keep_alive()
        request.http_10 = self.parser.get_http_version() == "1.0"
        self.parsing = request
        if self.answering is None:
            self._answer(request)
        else:
            self.waiting.append(request)

    def on_body(self, body: bytes) -> None:
        if self.parsing is not None:
            self.parsing._feed(body)

    def on_message_complete(self) -> None:
        if self.parsing is not None:
            self.parsing._ended()
            self.parsing = None

    # -- answering

    def write(self, data: bytes) -> None:
        """Queues `data`; what is queued in one turn of the loop goes out
        in one write (a stream's last events and its end, say)."""
        if self.closing:
            return
        if not self.out:
            self.loop.call_soon(self._flush)
        self.out.append(data)

    def _flush(self) -> None:
        if self.out and not self.closing:
            self.transport.write(b"".join(self.out))
        self.out.clear()

    def _refuse(self, status: int, message: str) -> None:
        if not self.closing:
            self.write(_plain(status, message))
            self.close()

    def close(self) -> None:
        """Closes the connection once what is queued is written."""
        self._flush()
        self.closing = True
        self.transport.close()

    def _answer(self, request: Request) -> None:
        self.answered = request
        self.answering = self.loop.create_task(self._run(request))

    async def _run(self, request: Request) -> None:
        try:
            try:
                response = await self.server.handler(request)
            except Exception:  # noqa: BLE001 - the client is answered; the log has the trace
                log.exception("HTTP request failed")
                response = Answer(_error_body("internal error"), 500)
            close = not request.keep_alive or self.server.stopping
            if isinstance(response, EventStream):
                close = await self._stream(request, response, close)
            else:
                # The unread rest of a body answered early (a 413) is not read.
                close = close or request.incomplete
                media = response.media_type
                head = _head(response.status, media, response.headers, len(response.body), close)
                self.write(head + response.body)
        except asyncio.CancelledError:
            close = True
        close = close or request.incomplete
        self.answering = self.answered = None
        if close or self.closing:
            self.close()
        elif self.waiting:
            self._answer(self.waiting.popleft())
        else:
            self._arm_idle()

    async def _stream(self, request: Request, stream: EventStream, close: bool) -> bool:
        """Writes `stream`; True when the connection is to close after it."""
        chunked = not request.http_10
        headers = {**stream.headers, "cache-control": "no-cache"}
        self.write(_head(200, EVENT_STREAM, headers, None, close or not chunked))
        self.streaming = True
        try:
            async with contextlib.aclosing(stream.events):
                async for event in stream.events:
                    # Checked after the first event, not before: an iterator
                    # closed before it starts never runs its cleanup.
                    if request.gone:
                        return True  # it left while the stream was being set up
                    self.write(b"%x\r\n%b\r\n" % (len(event), event) if chunked else event)
                    if self.drained is not None:
                        await self.drained
            if chunked:
                self.write(b"0\r\n\r\n")
        except asyncio.CancelledError:
            if not request.gone:
                raise
            # The client left: the stream ends here, with nobody to read more.
            asyncio.current_task().uncancel()
            return True
        finally:
            self.streaming = False
            if stream.on_end is not None:
                stream.on_end()
        return close or not chunked

    def _arm_idle(self) -> None:
        if self.server.stopping:
            self.close()
            return
        self.timer.arm(self.server.keep_alive_s)

    def _timed_out(self) -> None:
        if self.answered is not None:
            self.answered._time_out()  # its body is late
        elif self.receiving_head:
            waited = self.server.keep_alive_s
            self._refuse(408, f"the request's headers did not arrive within {waited:g} s")
        elif self.parsing is None:
            self.close()


class Http1Server:
    def __init__(
        self,
        handler: Handler,
        listen: str,
        *,
        on_stopped: Callable[[], Awaitable[None]],
        keep_alive_s: float = KEEP_ALIVE_S,
    ) -> None:
        """Binds `listen` (`HOST:PORT`, checked; an IPv6 host in brackets);
        OSError when it cannot. `on_stopped` runs once the server is down."""
        self.handler = handler
        self.keep_alive_s = keep_alive_s
        self._on_stopped = on_stopped
        self.socket = http_listening_socket(listen)
        self.port = self.socket.getsockname()[1]
        self.stopping = False
        self._connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self, loop), sock=self.socket, backlog=2048
        )

    async def stop(self, grace_s: float) -> None:
        """Stops taking connections; open answers get `grace_s` to end, then
        their connections are closed."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            if connection.answering is None:
                connection.close()
        answering = [c.answering for c in self._connections if c.answering is not None]
        if answering:
            await asyncio.wait(answering, timeout=grace_s)
        for connection in list(self._connections):
            connection.close()
        if self._server is not None:
            await self._server.wait_closed()
        await self._on_stopped()
