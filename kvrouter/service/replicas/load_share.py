"""Routing decisions shared between router replicas, so that two replicas
do not pile onto the same worker.

The load book is the core's: each replica's `Router` keeps its peers'
bookings beside its own and scores every worker with both
(`Router.book_remote` and friends). This module only carries them over NATS.
The router notes every change to its own bookings as it makes them, however
it was asked to route (`Route`, `RouteStream`, `Generate`); `BookingExchange`
publishes those changes on `<prefix>.load` and, every few seconds, the
router's whole book. The periodic book repairs lost messages and lets a
peer's expired bookings lapse; a peer that goes silent is forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import msgspec
from nats.aio.client import Client

from kvrouter.adapters.nats.config import NatsConfig, check_name
from kvrouter.policy import Booking, Router

log = logging.getLogger("kvrouter.service.replicas.load_share")

# The router's change kinds, as the load messages name them.
_KINDS = {"routed": "route", "prefill_done": "prefill_done", "released": "finished"}


def _fields(booking: Booking) -> list:
    return [
        booking.prefill_worker,
        booking.decode_worker,
        booking.prefill_tokens,
        booking.decode_blocks,
        booking.prefill_open,
    ]


class BookingExchange:
    """Shares `router`'s bookings with the other replicas and books theirs
    into it. `router` must be made with `share_bookings=True`."""

    def __init__(
        self,
        router: Router,
        nc: Client,
        config: NatsConfig,
        replica: str,
        *,
        book_interval_s: float = 2.0,
        flush_interval_s: float = 0.005,
    ) -> None:
        self.router = router
        self.nc = nc
        self.nats = config
        self.replica = check_name(replica)
        self.book_interval_s = book_interval_s
        self.flush_interval_s = flush_interval_s
        self._heard: dict[str, float] = {}
        self._tasks: list[asyncio.Task] = []
        self._subscription = None

    async def start(self) -> None:
        self._subscription = await self.nc.subscribe(self.nats.load_subject, cb=self._on_message)
        # Once the server has the subscription, no peer's decision slips past.
        await self.nc.flush()
        self._tasks = [asyncio.create_task(self._send()), asyncio.create_task(self._announce())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._publish_changes()
        if self._subscription is not None:
            await self._subscription.unsubscribe()

    def knows(self, replica: str, request_id: str) -> bool:
        """Whether the peer's request is booked here."""
        return self.router.knows_remote(replica, request_id)

    async def _publish(self, message: list) -> None:
        await self.nc.publish(self.nats.load_subject, msgspec.msgpack.encode(message))

    async def _publish_changes(self) -> None:
        for kind, request_id, booking in self.router.take_booking_changes():
            fields = _fields(booking) if booking is not None else []
            await self._publish([_KINDS[kind], self.replica, request_id, *fields])

    async def _send(self) -> None:
        while True:
            await self._publish_changes()
            await asyncio.sleep(self.flush_interval_s)

    async def _announce(self) -> None:
        while True:
            await asyncio.sleep(self.book_interval_s)
            own = [[request_id, *_fields(b)] for request_id, b in self.router.own_bookings()]
            await self._publish(["book", self.replica, own])
            horizon = time.monotonic() - 3 * self.book_interval_s
            for replica in [r for r, at in self._heard.items() if at < horizon]:
                del self._heard[replica]
                dropped = self.router.drop_replica(replica)
                log.warning(
                    "peer replica went silent; its bookings lapse",
                    extra={"fields": {"replica": replica, "bookings": dropped}},
                )

    async def _on_message(self, msg) -> None:
        try:
            kind, replica, *rest = msgspec.msgpack.decode(msg.data)
            if replica != self.replica:
                self._heard[replica] = time.monotonic()
                self._apply_remote(kind, replica, rest)
        except (msgspec.DecodeError, ValueError, TypeError, OverflowError):
            log.warning("ignoring a malformed load message")

    def _apply_remote(self, kind: str, replica: str, rest: list) -> None:
        if kind == "route":
            request_id, *fields = rest
            self.router.book_remote(replica, request_id, Booking(*fields))
        elif kind == "prefill_done":
            self.router.remote_prefill_done(replica, rest[0])
        elif kind == "finished":
            self.router.release_remote(replica, rest[0])
        elif kind == "book":
            self.router.replace_remote(
                replica, [(request_id, Booking(*fields)) for request_id, *fields in rest[0]]
            )
