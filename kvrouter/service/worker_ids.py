"""Worker ids and registration tokens.

Ids the router assigns come from a counter that only goes up, and that the
index snapshot keeps, so an id is never handed out twice: not within one
router's life, nor across a restart from its snapshot. (Deriving it from the
highest id registered would hand a lapsed worker's id to the next newcomer.)
An id a worker picks itself may be anything up to `MAX_WORKER_ID`, which
leaves the counter room; the counter steps over ids in use.

Every registration gets a random token that the worker sends back with its
heartbeats, its deregistration and any later registration of the same id,
so a worker that lapsed and returns cannot act for one registered since.
"""

from __future__ import annotations

import secrets
from collections.abc import Container

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


class IdCounter:
    """The next id to assign; it only goes up."""

    def __init__(self, start: int) -> None:
        self.next_unused = max(start, 1)

    def take(self, in_use: Container[int]) -> int:
        while self.next_unused in in_use:
            self.next_unused += 1
        if self.next_unused > MAX_WORKER_ID:
            raise ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED, "every worker id has been assigned"
            )
        worker_id = self.next_unused
        self.next_unused += 1
        return worker_id
