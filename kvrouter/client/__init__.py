"""Client library: routing (`RouterClient`, `AsyncRouterClient`), worker
registration (`WorkerRegistration`) and KV event publishing
(`KvEventPublisher`).

`EventCollector` is the former name of `kvrouter.events.EventList` (what a
`dump_cache` callback fills), kept for one release."""

from kvrouter.client.credentials import Credentials
from kvrouter.client.publisher import KvEventPublisher
from kvrouter.client.router import AsyncRouterClient, RouterClient
from kvrouter.client.types import (
    Candidate,
    DeadlineExceeded,
    Explanation,
    InvalidArgument,
    NotFound,
    Registration,
    RouterError,
    RouteResult,
    Unavailable,
    WorkerInfo,
    WorkerLoad,
)
from kvrouter.client.worker import WorkerRegistration
from kvrouter.events.sink import EventList as EventCollector

__all__ = [
    "AsyncRouterClient",
    "Candidate",
    "Credentials",
    "DeadlineExceeded",
    "EventCollector",
    "Explanation",
    "InvalidArgument",
    "KvEventPublisher",
    "NotFound",
    "Registration",
    "RouteResult",
    "RouterClient",
    "RouterError",
    "Unavailable",
    "WorkerInfo",
    "WorkerLoad",
    "WorkerRegistration",
]
