"""An HTTP server on the caller's own event loop: uvicorn (httptools'
parser) serving an ASGI app from a socket the caller binds itself, so
that the gRPC service and the HTTP API share one process and one loop, and
the process keeps its own signal handling. The worker's engine-compatible
API (a Starlette app) serves with it; it needs uvicorn (the `frontend`
extra). The router's front door has a server of its own, without ASGI
(`http1_server.py`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import uvicorn

from kvrouter.net.addresses import http_listening_socket


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        # SIGTERM and SIGINT are the process's: it drains, then stops this server.
        yield


class HttpServer:
    def __init__(
        self, app, listen: str, *, on_stopped: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Binds `listen` (`HOST:PORT`, checked; an IPv6 host in brackets);
        OSError when it cannot. `on_stopped` runs once the server is down."""
        self._on_stopped = on_stopped
        self.socket = http_listening_socket(listen)
        self.port = self.socket.getsockname()[1]
        config = uvicorn.Config(
            app,
            lifespan="off",
            access_log=False,
            log_config=None,
        )
        self._server = _Server(config)
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(sockets=[self.socket]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("the HTTP server stopped as it started")
            await asyncio.sleep(0.01)

    async def stop(self, grace_s: float) -> None:
        """Stops taking connections; open responses get `grace_s` to end."""
        self._server.config.timeout_graceful_shutdown = grace_s
        self._server.should_exit = True
        if self._task is not None:
            await self._task
        if self._on_stopped is not None:
            await self._on_stopped()
