"""Admission control for the front door: a request runs at once while its
model has a worker with room, and otherwise waits in a bounded queue.

A model is saturated when the front door already runs `max_in_flight`
requests, or when every healthy worker of the model has more than
`max_backlog_ms` of predicted prefill queued (the core's `backlog_ms`: the
least loaded worker's queued prefill, priced as the routing cost's queue
term). A request for a saturated model waits; waiters are admitted per
model, strictly by priority class (every `high` waiter before any
`normal` one) and first come first served within a class. A full queue
refuses at once (429); a request that waits past `queue_timeout_s` is
refused (503). Both carry `Retry-After`.

Load falls without a signal the front door sees (a worker's prefill ends,
its heartbeat reports a shorter queue), so while anyone waits the queue
is rechecked every `RECHECK_S` as well as whenever a request ends."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections import deque
from collections.abc import Callable

from kvrouter.policy import UnknownModel
from kvrouter.service.openai.errors import HttpError

RECHECK_S = 0.02
PRIORITY_HEADER = "x-kvrouter-priority"


class Priority(enum.Enum):
    HIGH = "high"
    NORMAL = "normal"

    @classmethod
    def from_header(cls, value: str | None) -> Priority:
        """The class a request's header names (absent: normal); a 400 for
        any other value."""
        if value is None:
            return cls.NORMAL
        try:
            return cls(value.strip().lower())
        except ValueError:
            raise HttpError(
                400, f"{PRIORITY_HEADER} must be 'high' or 'normal', not {value!r}"
            ) from None


class Admission:
    def __init__(
        self,
        backlog_ms: Callable[[str], float | None],
        *,
        max_in_flight: int,
        max_backlog_ms: float,
        max_queued: int,
        queue_timeout_s: float,
        on_depth: Callable[[str, Priority, int], None] = lambda model, priority, depth: None,
    ) -> None:
        """`backlog_ms(model)` is the core's `Router.backlog_ms` (None: no
        healthy worker, so nothing to wait for); `on_depth` hears each
        queue's new depth."""
        self._backlog_ms = backlog_ms
        self.max_in_flight = max_in_flight
        self.max_backlog_ms = max_backlog_ms
        self.max_queued = max_queued
        self.queue_timeout_s = queue_timeout_s
        self._on_depth = on_depth
        self.in_flight = 0
        self.queued = 0
        self._queues: dict[str, dict[Priority, deque[asyncio.Future]]] = {}
        self._rechecks: asyncio.Task | None = None

    def saturated(self, model: str) -> bool:
        if self.in_flight >= self.max_in_flight:
            return True
        try:
            backlog = self._backlog_ms(model)
        except UnknownModel:
            return False
        return backlog is not None and backlog > self.max_backlog_ms

    async def admit(self, model: str, priority: Priority) -> float:
        """Waits for the request's turn; returns the seconds it waited.
        Call `release` once for every admission, when the request ends."""
        queues = self._queues.get(model)
        ahead = queues and any(queues[p] for p in _at_or_above(priority))
        if not ahead and not self.saturated(model):
            self.in_flight += 1
            return 0.0
        if self.queued >= self.max_queued:
            raise HttpError(
                429,
                f"{self.queued} requests are waiting for a worker, the most this router "
                "holds; retry later",
            )
        started = time.monotonic()
        admitted = asyncio.get_running_loop().create_future()
        queue = self._queues.setdefault(model, {p: deque() for p in Priority})[priority]
        queue.append(admitted)
        self._changed(model, priority, +1)
        self._ensure_rechecks()
        try:
            await asyncio.wait_for(asyncio.shield(admitted), self.queue_timeout_s)
        except (TimeoutError, asyncio.CancelledError) as e:
            if admitted.done():
                # Admitted as the wait ended: give the place back.
                self.release()
            else:
                queue.remove(admitted)
                self._changed(model, priority, -1)
                self._admit_waiting()
            if isinstance(e, asyncio.CancelledError):
                raise
            raise HttpError(
                503,
                f"no worker of {model!r} had room within {self.queue_timeout_s:g} s "
                f"(each has over {self.max_backlog_ms:g} ms of prefill queued, or "
                f"{self.max_in_flight} requests are running); retry later",
            ) from None
        return time.monotonic() - started

    def release(self) -> None:
        self.in_flight -= 1
        self._admit_waiting()

    def _admit_waiting(self) -> None:
        for model, queues in self._queues.items():
            for priority in Priority:
                queue = queues[priority]
                while queue and not self.saturated(model):
                    admitted = queue.popleft()
                    self._changed(model, priority, -1)
                    self.in_flight += 1
                    admitted.set_result(None)
                if queue:
                    # Strict order: a lower class waits while a higher one does.
                    break

    def _changed(self, model: str, priority: Priority, delta: int) -> None:
        self.queued += delta
        self._on_depth(model, priority, len(self._queues[model][priority]))

    def _ensure_rechecks(self) -> None:
        if self._rechecks is None or self._rechecks.done():
            self._rechecks = asyncio.ensure_future(self._recheck())

    async def _recheck(self) -> None:
        while self.queued:
            await asyncio.sleep(RECHECK_S)
            self._admit_waiting()

    async def close(self) -> None:
        if self._rechecks is not None:
            self._rechecks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._rechecks


def _at_or_above(priority: Priority) -> list[Priority]:
    classes = list(Priority)
    return classes[: classes.index(priority) + 1]
