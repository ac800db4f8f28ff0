"""Routers started for real on 127.0.0.1 (free ports), each on an event loop
of its own thread: what the service, reliability and security tests share."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

from kvrouter.client.background import finish_pending
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
        close_loop_thread(self.loop, self._thread)


def close_loop_thread(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Stops a loop running on `thread` and closes it, finishing its leftover
    tasks and async generators first."""
    asyncio.run_coroutine_threadsafe(finish_pending(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


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
