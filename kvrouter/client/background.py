"""An asyncio event loop on a daemon thread, for driving async client code
from synchronous callers (an engine's own thread)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any


async def finish_pending() -> None:
    """Cancels the running loop's other tasks and closes its async generators
    (gRPC calls' request and response streams among them), so that nothing is
    left to wake up on the loop after it is closed."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()


class BackgroundLoop:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        """Runs `coro` on the loop and waits for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call_soon(self, callback, *args) -> None:
        """Schedules `callback` on the loop; a no-op once the loop is stopped."""
        try:
            self.loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # closed while another thread was still calling in
            pass

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.run(finish_pending(), timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
