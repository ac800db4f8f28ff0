"""Keeps a long-running part (`async with part:`) up until SIGINT or SIGTERM.
A signal while the part is still starting (waiting for a router that is not
up yet, say) stops it too: the start is cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from contextlib import AbstractAsyncContextManager


async def until_signal(part: AbstractAsyncContextManager) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    stopping = asyncio.ensure_future(stop.wait())
    starting = asyncio.ensure_future(part.__aenter__())
    await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        return
    try:
        starting.result()
    except BaseException:
        stopping.cancel()
        raise
    try:
        await stopping
    finally:
        await part.__aexit__(None, None, None)
