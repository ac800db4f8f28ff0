"""Client library: routing (`RouterClient`, `AsyncRouterClient`), worker
registration (`WorkerRegistration`) and KV event publishing
(`KvEventPublisher`).

Layer: may import `kvrouter._core`, `kvrouter.events`, `kvrouter.net` and
`kvrouter.proto_gen` only (docs/architecture.md). `Credentials` lives in
`kvrouter.net` and is re-exported here. `EventCollector` is the former name
of `kvrouter.events.EventList` (what a `dump_cache` callback fills), kept
for one release."""

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
from kvrouter.net.credentials import Credentials

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
