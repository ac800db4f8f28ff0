"""The engine HTTP client against real sockets on 127.0.0.1: servers that
answer as HTTP/1.1 servers do (lengths, chunks, a body ended by closing),
one that closes a kept connection as a request is written to it, and one
that answers garbage."""

from __future__ import annotations

import asyncio

import pytest

from kvrouter.net.http_client import HttpClient, HttpClientError


async def serve(answers):
    """A server whose nth request on a connection gets `answers(n)`: bytes
    to write, or None to close the connection without a byte."""
    peers = []

    async def on_connection(reader, writer):
        peers.append(writer.get_extra_info("peername"))
        try:
            await answer_each(reader, writer)
        except (asyncio.IncompleteReadError, asyncio.CancelledError):
            writer.close()  # the client left, or the test ended

    async def answer_each(reader, writer):
        n = 0
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            answer = answers(n)
            n += 1
            if answer is None:
                writer.close()
                return
            writer.write(answer)
            await writer.drain()
            if b"Connection: close" in answer:
                writer.close()
                return

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions", peers


TIMEOUT_S = 10.0
# A limit a silent server runs out: what is measured is that it does.
SHORT_S = 0.05


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def chunked(*parts: bytes) -> bytes:
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"


def exchange(answers, requests: int = 1) -> tuple[list[tuple[int, bytes]], list]:
    """`requests` POSTs in turn through one client to a server answering
    `answers`: each one's status and whole body, and the connections made."""

    async def main():
        server, url, peers = await serve(answers)
        client = HttpClient()
        got = []
        try:
            for _ in range(requests):
                headers = {"Content-Type": "application/json"}
                response = await client.post(url, b"{}", headers, TIMEOUT_S)
                body = await response.read(TIMEOUT_S)
                response.release()
                got.append((response.status, body))
        finally:
            await client.close()
            server.close()
        return got, peers

    return asyncio.run(main())


def test_requests_in_turn_reuse_one_connection_and_read_chunks_whole():
    got, peers = exchange(lambda n: chunked(b"data: %d\n\n" % n, b"data: [DONE]\n\n"), 3)
    assert got == [(200, b"data: %d\n\ndata: [DONE]\n\n" % n) for n in range(3)]
    assert len(peers) == 1


def test_a_kept_connection_closed_as_it_is_written_to_is_replaced():
    # The server answers a connection's first request, then closes it on the
    # second without a byte: as a server closing an idle connection does.
    got, peers = exchange(lambda n: ok(b"fine") if n == 0 else None, 3)
    assert got == [(200, b"fine")] * 3
    # Each later request went to the kept connection, which closed, then to a new one.
    assert len(peers) == 3


def test_a_body_without_length_or_chunks_ends_with_the_connection():
    got, _ = exchange(lambda n: b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall")
    assert got == [(200, b"all")]


def test_a_response_cut_short_is_an_os_error():
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nhalf"
    with pytest.raises(OSError):
        exchange(lambda n: cut)


def test_garbage_is_an_http_client_error():
    with pytest.raises(HttpClientError):
        exchange(lambda n: b"SMTP ready\r\n\r\n")


def test_no_server_is_an_os_error():
    async def main():
        server, url, _ = await serve(lambda n: None)
        server.close()
        await server.wait_closed()
        client = HttpClient()
        await client.post(url, b"{}", {}, TIMEOUT_S)

    with pytest.raises(OSError):
        asyncio.run(main())


def test_a_server_silent_past_the_limit_is_a_timeout_and_its_connection_is_not_kept():
    # The first connection's server never answers its request, or, on the
    # second, sends a stream's head and then nothing; a third answers.
    heads_only = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    connections = []

    def answers(_):
        connections.append(None)
        return (b"", heads_only, ok(b"fine"))[min(len(connections), 3) - 1]

    async def main():
        server, url, peers = await serve(answers)
        client = HttpClient()
        try:
            with pytest.raises(TimeoutError):
                await client.post(url, b"{}", {}, SHORT_S)
            response = await client.post(url, b"{}", {}, TIMEOUT_S)
            with pytest.raises(TimeoutError):
                await response.read_some(SHORT_S)
            response.close()
            response = await client.post(url, b"{}", {}, TIMEOUT_S)
            assert await response.read(TIMEOUT_S) == b"fine"
        finally:
            await client.close()
            server.close()
        return peers

    assert len(asyncio.run(main())) == 3
