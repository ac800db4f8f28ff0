"""Routers started for real on 127.0.0.1 (free ports), each on an event loop
of its own thread: what the service, reliability and security tests share."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

from kvrouter.service import RouterServer, ServiceConfig


def router_config(**overrides) -> ServiceConfig:
    """A ServiceConfig on a free port, with no metrics port and no decision log
    unless `overrides` say otherwise."""
    defaults = dict(listen="127.0.0.1:0", metrics_listen="", log_decisions=False)
    return dataclasses.replace(ServiceConfig(), **{**defaults, **overrides})


class ThreadedRouter:
    def __init__(self, config: ServiceConfig) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server = RouterServer(config)
        self.call(self.server.start())
        self.target = f"127.0.0.1:{self.server.port}"

    def call(self, coro, timeout: float = 30.0):
        """Runs a coroutine on the router's loop (where its state lives)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def on_loop(self, fn, *args):
        async def wrapper():
            return fn(*args)

        return self.call(wrapper())

    def stop(self) -> None:
        self.call(self.server.stop(grace=0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def started_routers(make):
    """The body of a `start_router` fixture: `make(**overrides)` starts a
    router; every router started is stopped after the test."""
    started: list = []

    def start(**overrides):
        router = make(**overrides)
        started.append(router)
        return router

    yield start
    for router in started:
        router.stop()
