"""The ceiling of a front door on one asyncio event loop: a reverse proxy that
does nothing a router must do (no body decode, no tokenizer, no routing, no
detokenize or re-encode) and only moves bytes. It parses each request with
httptools (uvicorn's parser), POSTs the body unchanged to the backend with
kvrouter's engine client (`kvrouter.net.http_client`, kept-alive
connections), and streams the backend's body back as it arrives, chunked.

`bench/router_overhead.py --legs ... asyncio-ceiling` runs it as a leg, in
the same run as kvrouter and the Rust routers, so that what any front door
on one Python event loop can reach on this machine is a measured figure,
not a guess.

    python bench/asyncio_proxy_ceiling.py --port 8200 --backend http://127.0.0.1:8100
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket

import uvloop
from openai_stub_backend import Connection

from kvrouter.net.http_client import HttpClient

# The engine's limits, as the front door's client has them (none is reached).
TIMEOUT_S = 30.0

STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
HEALTH = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class Proxied(Connection):
    """One client connection, parsed as the stub backend parses its own;
    each request is forwarded instead of answered."""

    def __init__(self, client: HttpClient, backend: str) -> None:
        super().__init__(backend=None)
        self.client = client
        self.backend_url = backend
        self.task: asyncio.Task | None = None

    def connection_lost(self, exc) -> None:
        if self.task is not None:
            self.task.cancel()

    def on_message_complete(self) -> None:
        if self.parser.get_method() == b"GET":
            self.transport.write(HEALTH)
            return
        path = self.url.partition(b"?")[0].decode()
        self.task = asyncio.ensure_future(self.forward(path, b"".join(self.body)))

    async def forward(self, path: str, body: bytes) -> None:
        response = await self.client.post(
            self.backend_url + path, body, {"Content-Type": "application/json"}, TIMEOUT_S
        )
        write = self.transport.write
        write(STREAM_HEAD)
        while data := await response.read_some(TIMEOUT_S):
            write(b"%x\r\n%b\r\n" % (len(data), data))
        write(b"0\r\n\r\n")
        response.release()


async def serve(port: int, backend: str) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    sock = socket.create_server(("127.0.0.1", port), backlog=4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client = HttpClient()
    server = await loop.create_server(lambda: Proxied(client, backend), sock=sock)
    async with server:
        await stop.wait()
    with contextlib.suppress(Exception):
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", required=True, help="the backend's origin, http://HOST:PORT")
    args = parser.parse_args()
    uvloop.run(serve(args.port, args.backend.rstrip("/")))


if __name__ == "__main__":
    main()
