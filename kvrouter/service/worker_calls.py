"""Calls from the router's proxy to workers: deadlines, reading streams with
an idle timeout, and sorting failures into "try another worker" and "end
the request with this status"."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import grpc

# Codes after which another worker may well succeed.
RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)


class RequestFailed(Exception):
    """Ends the request with this status for the client."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class WorkerFailure(Exception):
    """A worker failed its part; another worker may take over."""

    def __init__(self, worker_id: int, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"worker {worker_id}: {code.name}: {message}")
        self.worker_id = worker_id
        self.code = code
        self.message = message


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def timeout(self, stage_s: float, stage: str) -> float:
        """The time `stage` may take: its own limit, cut to what the request has left."""
        remaining = self.remaining()
        if remaining <= 0:
            raise RequestFailed(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"the request's deadline passed before {stage}"
            )
        return min(stage_s, remaining)


def failure(worker_id: int, error: grpc.RpcError, deadline: Deadline, stage: str) -> WorkerFailure:
    """A worker's error as a WorkerFailure, or RequestFailed when retrying cannot help."""
    code, details = error.code(), error.details() or ""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and deadline.remaining() <= 0:
        raise RequestFailed(code, f"the request's deadline passed during {stage}")
    if code not in RETRYABLE:
        raise RequestFailed(code, f"{stage} on worker {worker_id}: {details}")
    return WorkerFailure(worker_id, code, details)


async def read_stream(
    call, worker_id: int, idle_s: Callable[[], float], deadline: Deadline, stage: str
) -> AsyncIterator:
    """A server stream's messages. A worker silent for `idle_s()` seconds is
    failed and its call cancelled; so is one whose stream ends early (the
    caller decides what early means)."""
    try:
        while True:
            try:
                message = await within(call.read(), idle_s(), worker_id, deadline, stage)
            except grpc.RpcError as e:
                raise failure(worker_id, e, deadline, stage) from None
            if message is grpc.aio.EOF:
                return
            yield message
    finally:
        call.cancel()


class Silence:
    """How long a worker may stay silent in one wait: `idle_s`, cut to the
    request's deadline; `failure()` is what its running out means."""

    __slots__ = ("timeout_s", "_deadline_cut", "_worker_id", "_stage")

    def __init__(self, idle_s: float, worker_id: int, deadline: Deadline, stage: str) -> None:
        remaining = max(deadline.remaining(), 0.0)
        self.timeout_s = min(idle_s, remaining)
        self._deadline_cut = self.timeout_s >= remaining
        self._worker_id = worker_id
        self._stage = stage

    def failure(self) -> Exception:
        """Decided by which limit was set, not by the clock after: the loop
        may wake a timer a little early, with the deadline not yet passed."""
        if self._deadline_cut:
            return RequestFailed(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the request's deadline passed during {self._stage}",
            )
        return WorkerFailure(
            self._worker_id,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"silent for {self.timeout_s:.1f}s",
        )


async def within(awaitable, idle_s: float, worker_id: int, deadline: Deadline, stage: str):
    """`awaitable`'s result, if the worker answers within `idle_s` and the
    request's deadline; a worker silent for longer is failed."""
    silence = Silence(idle_s, worker_id, deadline, stage)
    try:
        # A timeout scope, not wait_for: wait_for wraps each read in a task of its own.
        async with asyncio.timeout(silence.timeout_s):
            return await awaitable
    except TimeoutError:
        raise silence.failure() from None
