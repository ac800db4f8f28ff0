"""The HTTP/1.1 client the router calls engines with: one POST at a time
per connection, connections kept alive per origin, httptools' parser (the
one uvicorn uses), and a body read as it arrives.

Why not aiohttp: its per-request machinery (request and response objects,
tracing hooks, cookie and redirect handling, a stream reader) was a third
of the front door's event-loop time per request against an engine that
costs nothing; the router needs none of it. This is the part it needs:
write a request, parse a response, reuse the connection.

Every failure to connect, a connection lost before its response ended,
and a response that does not parse are OSErrors (`HttpClientError` for
the last), which the callers already sort as the engine's failure.

An idle connection is closed after `IDLE_S`, under the 5 s that uvicorn
(vLLM's and SGLang's server) keeps one open, so a kept connection is not
one the server is closing. A request written to a kept connection that
closes before any byte of its response is sent once more on a new one:
the server had closed it idle, and never saw the request."""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Callable
from urllib.parse import urlsplit

import httptools

from kvrouter.net.lazy_timer import LazyTimer

IDLE_S = 4.0
# Buffered body bytes past which the socket stops being read until the caller reads.
HIGH_WATER_BYTES = 1 << 20


class HttpClientError(OSError):
    """A response that is not HTTP/1.1 the parser takes."""


class _Connection(asyncio.Protocol):
    """One connection and the response being read on it (httptools calls
    the `on_*` methods as it parses)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.reused = False
        # One timer for every limit: a caller's wait, and the idle time.
        self.timer = LazyTimer(loop, self._timed_out)
        # What to do when the idle time is up (kept in the pool, or drained).
        self.on_idle_expiry: Callable[[], None] | None = None
        # Set when the caller is done with a response whose end has not come yet.
        self.on_complete = None
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.keep_alive = False
        self.headers: list[tuple[bytes, bytes]] = []
        self.received = False
        self.complete = False
        self.error: BaseException | None = None
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.paused = False
        self.waiter: asyncio.Future | None = None

    @property
    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    # -- asyncio.Protocol

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(HttpClientError(f"the engine's response does not parse: {e}"))
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.timer.close()
        if exc is None and self._ends_at_close():
            self.complete = True
            self._wake()
        elif not self.complete:
            self._fail(exc or ConnectionResetError("the engine closed the connection"))

    def _ends_at_close(self) -> bool:
        """A body with neither a length nor chunks ends where the connection does."""
        if not self.status:
            return False
        names = {name for name, _ in self.headers}
        chunked = any(
            n == b"transfer-encoding" and b"chunked" in v.lower() for n, v in self.headers
        )
        return b"content-length" not in names and not chunked

    # -- httptools

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        # Asked here: once the message is complete the parser describes the next one.
        self.keep_alive = self.parser.should_keep_alive()
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self.on_complete is not None:
            return  # the caller has what it wanted; the rest is drained
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER_BYTES and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()
        if self.on_complete is not None:
            on_complete, self.on_complete = self.on_complete, None
            self.chunks.clear()
            on_complete()

    # --

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _timed_out(self) -> None:
        if self.waiter is not None:
            if not self.waiter.done():
                self.waiter.set_exception(TimeoutError())
        elif self.on_idle_expiry is not None:
            self.on_idle_expiry()

    async def _wait(self) -> None:
        self.waiter = self.loop.create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    async def head(self, timeout_s: float) -> None:
        """Returns once the response's status and headers are in;
        TimeoutError when they are not within `timeout_s`."""
        if self.status:
            return
        self.timer.arm(timeout_s)
        try:
            while not self.status:
                if self.error is not None:
                    raise self.error
                await self._wait()
        finally:
            self.timer.disarm()

    async def read_some(self, timeout_s: float) -> bytes:
        """The body's next bytes; b"" once it has ended. TimeoutError when
        none come within `timeout_s`."""
        if not self.chunks:
            self.timer.arm(timeout_s)
            try:
                while not self.chunks:
                    if self.complete:
                        return b""
                    if self.error is not None:
                        raise self.error
                    await self._wait()
            finally:
                self.timer.disarm()
        data = b"".join(self.chunks) if len(self.chunks) > 1 else self.chunks[0]
        self.chunks.clear()
        self.buffered = 0
        if self.paused:
            self.paused = False
            self.transport.resume_reading()
        return data


class Response:
    """A response whose status and headers have arrived; its body is read
    with `read_some` or `read`. `release` (after the body has ended) keeps
    the connection for the next request; `close` drops it."""

    def __init__(self, client: HttpClient, origin: tuple, connection: _Connection) -> None:
        self._client = client
        self._origin = origin
        self._connection: _Connection | None = connection
        self.status = connection.status
        self.headers = connection.headers

    async def read_some(self, timeout_s: float) -> bytes:
        """The body's next bytes; b"" once it has ended. TimeoutError when
        none come within `timeout_s`."""
        return await self._connection.read_some(timeout_s)

    async def read(self, timeout_s: float) -> bytes:
        """The rest of the body; TimeoutError when it is silent for `timeout_s`."""
        parts = []
        while part := await self.read_some(timeout_s):
            parts.append(part)
        return b"".join(parts)

    async def text(self, timeout_s: float) -> str:
        return (await self.read(timeout_s)).decode("utf-8", "replace")

    def release(self) -> None:
        """Keeps the connection once the response has ended: now, or when
        its last bytes (a stream's closing chunk, often a read behind the
        last event) arrive within `IDLE_S`."""
        connection, self._connection = self._connection, None
        if connection is None or not connection.usable:
            return
        if not connection.complete:
            connection.on_complete = lambda: self.release_ended(connection)
            if connection.paused:
                connection.transport.resume_reading()
            connection.on_idle_expiry = connection.transport.close
            connection.timer.arm(IDLE_S)
            return
        self.release_ended(connection)

    def release_ended(self, connection: _Connection) -> None:
        connection.on_idle_expiry = None
        connection.timer.disarm()
        if connection.usable and connection.keep_alive:
            self._client._keep(self._origin, connection)
        else:
            connection.transport.close()

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and connection.transport is not None:
            connection.transport.close()


class HttpClient:
    """POSTs to `http://` and `https://` origins; `ssl_context` for the
    latter (True: the system's trust)."""

    def __init__(self, ssl_context: ssl.SSLContext | bool = True) -> None:
        self._ssl = ssl_context
        self._idle: dict[tuple, list[_Connection]] = {}
        self._origins: dict[str, tuple[tuple, str]] = {}

    def _origin(self, url: str) -> tuple[tuple, str]:
        """`url`'s origin (scheme, host, port) and target, parsed once per URL."""
        parsed = self._origins.get(url)
        if parsed is None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise HttpClientError(f"not an http(s) URL: {url!r}")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            parsed = self._origins[url] = ((parts.scheme, parts.hostname, port), target)
        return parsed

    async def post(
        self, url: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> Response:
        """The response to a POST of `body`, once its headers have arrived;
        TimeoutError when they have not within `timeout_s` (the connection
        is then closed)."""
        origin, target = self._origin(url)
        scheme, host, port = origin
        host_header = host if port in (80, 443) else f"{host}:{port}"
        head = [f"POST {target} HTTP/1.1", f"Host: {host_header}", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        # Head and body in one vectored write, the body not copied.
        request = (("\r\n".join(head) + "\r\n\r\n").encode("latin-1"), body)
        while True:
            connection = self._kept(origin) or await self._connect(scheme, host, port)
            connection.transport.writelines(request)
            try:
                await connection.head(timeout_s)
            except TimeoutError:
                connection.transport.close()
                raise
            except OSError:
                if connection.reused and not connection.received:
                    continue  # closed idle by the server as it was written to
                raise
            except BaseException:
                connection.transport.close()
                raise
            return Response(self, origin, connection)

    def _kept(self, origin: tuple) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            connection.on_idle_expiry = None
            connection.timer.disarm()
            if connection.usable:
                connection._reset()
                connection.reused = True
                return connection
        return None

    async def _connect(self, scheme: str, host: str, port: int) -> _Connection:
        loop = asyncio.get_running_loop()
        secure = self._ssl if scheme == "https" else None
        _, connection = await loop.create_connection(
            lambda: _Connection(loop),
            host,
            port,
            ssl=secure,
            server_hostname=host if secure else None,
        )
        return connection

    def _keep(self, origin: tuple, connection: _Connection) -> None:
        idle = self._idle.setdefault(origin, [])
        idle.append(connection)
        connection.on_idle_expiry = lambda: self._expire(origin, connection)
        connection.timer.arm(IDLE_S)

    def _expire(self, origin: tuple, connection: _Connection) -> None:
        idle = self._idle.get(origin)
        if idle and connection in idle:
            idle.remove(connection)
        connection.transport.close()

    async def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.timer.close()
                connection.transport.close()
        self._idle.clear()
