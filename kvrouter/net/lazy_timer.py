"""A deadline that moves on every request, at the cost of a float.

A connection's limits (the keep-alive time, a read's silence, a body's
arrival) move with every request, and almost always later. Re-arming a loop
timer each time costs a timer handle (in uvloop, a libuv timer) per move,
and `asyncio.timeout` a task lookup and a reschedule besides: together a
tenth of the front door's event-loop time per request. Here moving the
deadline only records it; the loop's timer is re-armed only when it fires
before the deadline (it then waits for the rest) or when the deadline moves
earlier than the timer. A connection's timer so fires about once per limit's
length, not once per request."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

# libuv's clock ticks in milliseconds: a timer may fire up to one early.
CLOCK_TICK_S = 0.001


class LazyTimer:
    """Calls `expired()` once the loop's clock passes the deadline `arm`
    set, unless `disarm` came first. `expired` runs at most once per arm."""

    __slots__ = ("_loop", "_expired", "_deadline", "_handle")

    def __init__(self, loop: asyncio.AbstractEventLoop, expired: Callable[[], None]) -> None:
        self._loop = loop
        self._expired = expired
        self._deadline: float | None = None
        self._handle: asyncio.TimerHandle | None = None

    def arm(self, delay_s: float) -> None:
        """The deadline is `delay_s` from now (replacing any earlier one)."""
        deadline = self._deadline = self._loop.time() + delay_s
        handle = self._handle
        if handle is not None and handle.when() <= deadline:
            return  # it fires first, and then waits for the rest
        if handle is not None:
            handle.cancel()
        self._handle = self._loop.call_at(deadline, self._fire)

    def disarm(self) -> None:
        """No deadline; a timer still pending finds none when it fires."""
        self._deadline = None

    def close(self) -> None:
        self._deadline = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        deadline = self._deadline
        if deadline is None:
            return
        if self._loop.time() < deadline - CLOCK_TICK_S:
            self._handle = self._loop.call_at(deadline, self._fire)
            return
        self._deadline = None
        self._expired()
