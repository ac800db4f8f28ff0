"""`KvEventPublisher`: a worker's KV events to the router's KvEvents stream,
for engines that run on threads of their own.

It is the `EventPublisher` (`kvrouter.events.publisher`: batching,
numbering, the replay buffer, resyncs with a dump, reconnects with backoff)
over the gRPC transport, driven from a background event loop so that its
lifecycle is plain calls: `start()`, `flush()`, `close()`. Asyncio code can
use the `EventPublisher` itself on its own loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvrouter.client.background import BackgroundLoop
from kvrouter.client.event_stream import GrpcEventTransport
from kvrouter.events.model import Event
from kvrouter.events.publisher import EventPublisher
from kvrouter.events.sink import EventSink
from kvrouter.net.credentials import Credentials


class KvEventPublisher(EventSink):
    """Publishes one worker's KV events. Thread-safe; `start()` it, call the
    sink methods from the engine, `close()` it at shutdown."""

    def __init__(
        self,
        target: str,
        worker_id: int,
        *,
        credentials: Credentials | None = None,
        **settings: Any,
    ) -> None:
        """`settings` are `EventPublisher`'s keyword arguments (block_size,
        model, namespace, dump_cache, batching, replay and backoff limits), with its
        defaults."""
        self.transport = GrpcEventTransport(target, credentials)
        self.publisher = EventPublisher(self.transport, worker_id, **settings)
        self.namespace = self.publisher.namespace
        self._bg: BackgroundLoop | None = None

    def emit(self, events: Iterable[Event]) -> None:
        self.publisher.emit(events)

    # -- lifecycle
    def start(self) -> KvEventPublisher:
        self._bg = BackgroundLoop(f"kv-events-{self.worker_id}")
        self._bg.run(self.publisher.start())
        return self

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until every event emitted so far is acknowledged; False on timeout."""
        if self._bg is None:
            raise RuntimeError("start() the publisher before flushing it")
        return self._bg.run(self.publisher.flush(timeout))

    def close(self, timeout: float = 5.0) -> None:
        """Delivers what it can within `timeout`, then stops; later events are dropped."""
        if self._bg is None:
            return
        self._bg.run(self.publisher.stop(timeout))
        self._bg.stop()
        self._bg = None

    # -- where it stands
    @property
    def target(self) -> str:
        """The router; a change takes effect at the next reconnect."""
        return self.transport.target

    @target.setter
    def target(self, target: str) -> None:
        self.transport.target = target

    @property
    def worker_id(self) -> int:
        return self.publisher.worker_id

    @property
    def next_seq(self) -> int:
        return self.publisher.next_seq

    @property
    def pending_events(self) -> int:
        """Events not yet cut into a batch; at most `max_pending_events`."""
        return self.publisher.pending_events

    @property
    def connected(self) -> bool:
        return self.publisher.connected

    @property
    def resyncs_answered(self) -> int:
        return self.publisher.resyncs_answered

    @property
    def overflows(self) -> int:
        return self.publisher.overflows

    @property
    def dumps_sent(self) -> int:
        return self.publisher.dumps_sent
