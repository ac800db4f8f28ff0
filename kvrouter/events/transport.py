"""What a publisher needs from the way its batches travel: a link that
takes batches and says how far the receiver is.

Two transports exist: the router's KvEvents stream
(`kvrouter.client.event_stream`) and the JetStream stream that router
replicas read (`kvrouter.adapters.nats.transport`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from kvrouter.events.model import WorkerBatch


@dataclass(frozen=True)
class Hello:
    """Who is publishing, and the batch number it will send next."""

    worker_id: int
    next_seq: int
    block_size: int
    # The worker's current registration token, for a receiver that checks
    # it (the router's event stream); 0: none.
    registration_token: int = 0


@dataclass(frozen=True)
class Reply:
    """The receiver holds every batch below `seq`. With `resync`, it needs
    the batches from `seq` on again: replayed, or a full dump."""

    seq: int
    resync: bool = False


class LinkClosed(Exception):
    """The link is gone; the publisher reconnects. With `refused`, the
    receiver refused what it was sent, so replaying it would not help."""

    def __init__(self, reason: str, *, refused: bool = False) -> None:
        super().__init__(reason)
        self.refused = refused


class Link(Protocol):
    async def send(self, batch: WorkerBatch) -> None:
        """Raises LinkClosed."""

    def replies(self) -> AsyncIterator[Reply]:
        """The receiver's replies, the first one soon after connecting. Ends
        when the receiver closes the link; raises LinkClosed."""


class Transport(Protocol):
    def connect(self, hello: Hello) -> AbstractAsyncContextManager[Link]:
        """A link for one session; raises LinkClosed."""
