"""The front door's HTTP/1.1 server (kvrouter.net.http1_server) on 127.0.0.1,
spoken to over raw sockets: what clients other than the SDK send (pipelined
requests, `Expect: 100-continue`, HTTP/1.0, garbage) gets a proper answer."""

from __future__ import annotations

import asyncio

import pytest

from kvrouter.net.http1_server import (
    Answer,
    BodyTooBig,
    EventStream,
    Http1Server,
    Request,
)

LIMIT = 64


async def _nothing() -> None:
    pass


class Served:
    """A server whose handler echoes bodies, streams on /stream and records
    a stream that was cut short."""

    def __init__(self) -> None:
        self.closed_streams = 0
        self.produced_events = 0
        self.release = asyncio.Event()
        self.set_up = asyncio.Event()
        self.saw_gone = False
        self.asked: Request | None = None

    async def handle(self, request: Request) -> Answer | EventStream:
        self.asked = request
        if request.path == "/stream":
            return EventStream(self._events(), {"x-request-id": "r1"})
        if request.path == "/until-gone":
            await request.disconnected()
            self.saw_gone = True
            return Answer(b"nobody reads this")
        if request.path == "/slow-stream":
            await self.set_up.wait()
            return EventStream(self._events(), {})
        try:
            body = await request.body(LIMIT, 5)
        except BodyTooBig as e:
            return Answer(str(e).encode(), 413)
        return Answer(b"%s %s %s" % (request.method.encode(), request.path.encode(), body))

    async def _events(self):
        try:
            self.produced_events += 1
            yield b"data: 1\n\n"
            self.produced_events += 1
            yield b"data: 2\n\n"
            await self.release.wait()
            yield b"data: [DONE]\n\n"
        finally:
            self.closed_streams += 1


async def _eventually(condition) -> None:
    """Returns once `condition()` holds; fails after 5 s."""
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0.01)


async def _ask_and_leave(served: Served, port: int, path: bytes) -> None:
    """GETs `path`, and closes the connection once the handler has it."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path)
    await _eventually(lambda: served.asked is not None)
    writer.close()


async def _exchange(port: int, data: bytes, until: bytes = b"", timeout: float = 5) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    got = b""
    try:
        async with asyncio.timeout(timeout):
            while not (until and until in got):
                chunk = await reader.read(65536)
                if not chunk:
                    break
                got += chunk
    finally:
        writer.close()
    return got


def _run(test, keep_alive_s: float = 5.0):
    async def main():
        served = Served()
        server = Http1Server(
            served.handle, "127.0.0.1:0", on_stopped=_nothing, keep_alive_s=keep_alive_s
        )
        await server.start()
        try:
            await test(served, server.port)
        finally:
            await server.stop(1)

    asyncio.run(main())


def test_pipelined_requests_are_answered_in_order():
    async def test(_, port):
        one = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\none"
        two = b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\ntwo"
        got = await _exchange(port, one + two)
        assert got.count(b"HTTP/1.1 200 OK") == 2
        assert got.index(b"POST /a one") < got.index(b"POST /b two")

    _run(test)


def test_a_client_that_expects_100_continue_is_told_to_send_its_body():
    async def test(_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
        )
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == (
            b"HTTP/1.1 100 Continue\r\n\r\n"
        )
        writer.write(b"hi")
        answer = await asyncio.wait_for(reader.readuntil(b"POST /a hi"), 5)
        assert answer.startswith(b"HTTP/1.1 200 OK")
        writer.close()

    _run(test)


def test_a_body_over_the_limit_is_413_and_its_connection_is_not_kept():
    async def test(_, port):
        # Its length says 1,000 bytes: the rest is not waited for.
        head = b"POST /a HTTP/1.1\r\nContent-Length: 1000\r\n\r\n"
        got = await _exchange(port, head + b"x" * (LIMIT + 1))
        assert got.startswith(b"HTTP/1.1 413 Request Entity Too Large")
        assert b"connection: close" in got

    _run(test)


@pytest.mark.parametrize(
    "request_bytes, status",
    [
        (b"NOT HTTP AT ALL\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nX-Big: " + b"y" * (70 << 10) + b"\r\n\r\n", b"431"),
    ],
)
def test_what_does_not_parse_gets_its_status_and_a_closed_connection(request_bytes, status):
    async def test(_, port):
        got = await _exchange(port, request_bytes)
        assert got.startswith(b"HTTP/1.1 " + status)
        assert b'"error"' in got

    _run(test)


def test_a_stream_is_chunked_and_its_events_arrive_whole():
    async def test(served, port):
        served.release.set()
        got = await _exchange(port, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", until=b"0\r\n\r\n")
        head, _, body = got.partition(b"\r\n\r\n")
        assert b"transfer-encoding: chunked" in head and b"x-request-id: r1" in head
        assert body == b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"

    _run(test)


def test_an_http_10_stream_ends_where_its_connection_does():
    async def test(served, port):
        served.release.set()
        got = await _exchange(port, b"GET /stream HTTP/1.0\r\n\r\n")
        head, _, body = got.partition(b"\r\n\r\n")
        assert b"transfer-encoding" not in head and b"connection: close" in head
        assert body == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"

    _run(test)


def test_a_client_gone_mid_stream_closes_the_events():
    async def test(served, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(reader.readuntil(b"data: 2"), 5)
        writer.close()
        await _eventually(lambda: served.closed_streams == 1)

    _run(test)


def test_a_client_gone_before_its_stream_began_ends_it_at_once():
    async def test(served, port):
        await _ask_and_leave(served, port, b"/slow-stream")
        await _eventually(lambda: served.asked.gone)
        served.set_up.set()
        await _eventually(lambda: served.closed_streams == 1)
        # Started, so that its cleanup runs, and closed after its first event.
        assert served.produced_events == 1

    _run(test)


def test_a_handler_learns_that_its_client_left():
    async def test(served, port):
        await _ask_and_leave(served, port, b"/until-gone")
        await _eventually(lambda: served.saw_gone)

    _run(test)


def test_headers_that_trickle_in_get_408_and_an_idle_connection_is_closed():
    async def test(_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /a HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        got = await asyncio.wait_for(reader.read(), 5)
        assert got.startswith(b"HTTP/1.1 408 Request Timeout")
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # idle: closed, no answer
        writer.close()

    _run(test, keep_alive_s=0.2)
