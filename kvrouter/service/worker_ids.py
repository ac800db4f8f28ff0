"""Worker ids and registration tokens.

Ids the router assigns come from a counter that only goes up, and that the
index snapshot keeps, so an id is never handed out twice: not within one
router's life, nor across a restart from its snapshot. (Deriving it from the
highest id registered would hand a lapsed worker's id to the next newcomer.)
An id a worker picks itself may be anything up to `MAX_WORKER_ID`, which
leaves the counter room; the counter steps over ids in use. Router
replicas of one deployment share one counter, so that no two of them hand
out the same id (kvrouter/service/replicas/shared_ids.py).

Every registration gets a random token that the worker sends back with its
heartbeats, its deregistration and any later registration of the same id,
so a worker that lapsed and returns cannot act for one registered since.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Container
from typing import Protocol

import grpc

from kvrouter.service.errors import ServiceError, invalid

# Ids fit a signed 64-bit integer: JSON readers, Prometheus and SQL take them.
MAX_WORKER_ID = 2**63 - 1


def check_worker_id(worker_id: int) -> None:
    if not 0 <= worker_id <= MAX_WORKER_ID:
        raise invalid(
            f"worker_id must be between 0 and {MAX_WORKER_ID} (2^63 - 1), not {worker_id}"
        )


def new_token() -> int:
    """A nonzero 64-bit token: zero is what a request without one carries."""
    return secrets.randbits(64) or 1


class IdBlock:
    """Ids from `next_unused` up to, not including, `end`, stepping over
    those in use; it only goes up."""

    def __init__(self, start: int, end: int) -> None:
        self.next_unused = max(start, 1)
        self.end = end

    def take(self, in_use: Container[int]) -> int | None:
        """The next id not in use, or None once the block has none left."""
        while self.next_unused < self.end and self.next_unused in in_use:
            self.next_unused += 1
        if self.next_unused >= self.end:
            return None
        worker_id = self.next_unused
        self.next_unused += 1
        return worker_id


def exhausted() -> ServiceError:
    return ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, "every worker id has been assigned")


class IdSource(Protocol):
    """Where a router's new ids come from."""

    @property
    def next_unused(self) -> int:
        """What the snapshot keeps: no id below it is handed out again."""

    async def take(self, in_use: Callable[[], Container[int]]) -> int:
        """A new id; `in_use()` gives the ids to step over."""


class IdCounter:
    """The single router's ids: the next one to assign; it only goes up.
    Router replicas share theirs instead (kvrouter.service.replicas)."""

    def __init__(self, start: int) -> None:
        self._ids = IdBlock(start, MAX_WORKER_ID + 1)

    @property
    def next_unused(self) -> int:
        return self._ids.next_unused

    async def take(self, in_use: Callable[[], Container[int]]) -> int:
        worker_id = self._ids.take(in_use())
        if worker_id is None:
            raise exhausted()
        return worker_id
