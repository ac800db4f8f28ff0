"""An engine's HTTP side as the sidecar probes it: `/health` and a
`/metrics` page, on a real server on 127.0.0.1, that a test can make fail
(`state = "down"`: 503), hang (`"hung"`: no answer) or stop."""

from __future__ import annotations

import asyncio

from aiohttp import web


class EngineHttp:
    def __init__(self, metrics: str = "") -> None:
        self.metrics = metrics
        self.state = "up"
        self._runner: web.AppRunner | None = None
        self._unhang = asyncio.Event()
        self.url = ""

    async def _health(self, _: web.Request) -> web.Response:
        if self.state == "hung":
            await self._unhang.wait()
        return web.Response(status=200 if self.state == "up" else 503)

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(text=self.metrics, content_type="text/plain")

    async def start(self, port: int = 0) -> EngineHttp:
        self._unhang.clear()
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, shutdown_timeout=0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def stop(self) -> None:
        self._unhang.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
