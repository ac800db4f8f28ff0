"""Keeps a long-running part (`async with part:`) up until SIGINT or SIGTERM."""

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
    async with part:
        await stop.wait()
