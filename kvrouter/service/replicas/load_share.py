"""Routing decisions shared between router replicas, so that two replicas
do not pile onto the same worker.

Each replica publishes its bookings on `<prefix>.load` as it makes them
(routed, prefill done, finished) and its whole book every few seconds; the
periodic book repairs lost messages and lets the bookings of a replica that
went silent lapse. Every replica adds the others' bookings to its own and
hands the totals to its `Router` as reported load. The policy takes the
larger of its own book and the reported load, so it then sees the load of
every replica's requests, or what the worker itself reports if that is more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import astuple, dataclass

import msgspec
from nats.aio.client import Client

from kvrouter.adapters.nats.config import NatsConfig, check_name

log = logging.getLogger(__name__)


@dataclass
class Booking:
    prefill_worker: int
    decode_worker: int
    prefill_tokens: int
    decode_blocks: int
    prefill_open: bool = True


class SharedLoadRouter:
    """A `kvrouter.policy.Router` whose load book spans all replicas; use it
    where the Router would be used (other methods pass through)."""

    def __init__(self, router, nc: Client, config: NatsConfig, replica: str, *,
                 book_interval_s: float = 2.0) -> None:
        self.router = router
        self.nc = nc
        self.nats = config
        self.replica = check_name(replica)
        self.book_interval_s = book_interval_s
        self.books: dict[str, dict[str, Booking]] = {replica: {}}
        self._booked_at: dict[tuple[str, str], float] = {}
        self._heard: dict[str, float] = {}
        self._reported: dict[int, tuple[int, int, int]] = {}
        self._totals: dict[int, list[int]] = {}
        self._outbox: asyncio.Queue[bytes] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._subscription = None

    async def start(self) -> None:
        self._subscription = await self.nc.subscribe(self.nats.load_subject,
                                                     cb=self._on_message)
        # Once the server has the subscription, no peer's decision slips past.
        await self.nc.flush()
        self._tasks = [asyncio.create_task(self._send()), asyncio.create_task(self._announce())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._subscription is not None:
            await self._subscription.unsubscribe()

    def __getattr__(self, name: str):
        return getattr(self.router, name)

    # -- the Router's lifecycle, shared
    def route(self, request_id: str, tokens, namespace: str = ""):
        decision = self.router.route(request_id, tokens, namespace)
        self.routed(request_id, decision.decode_worker, decision.prefill_worker,
                    decision.prefill_tokens, decision.num_blocks)
        return decision

    def routed(self, request_id: str, decode_worker: int, prefill_worker: int | None,
               prefill_tokens: int, num_blocks: int) -> None:
        """Shares a booking the policy made, however it was routed: the
        prompt's uncached tokens on the prefill worker, its blocks and one
        request on the decode worker."""
        prefill = decode_worker if prefill_worker is None else prefill_worker
        booking = Booking(prefill, decode_worker, prefill_tokens, num_blocks)
        self._book(self.replica, request_id, booking)
        self._post(["route", self.replica, request_id, *astuple(booking)])
        self._expire()

    def prefill_done(self, request_id: str) -> None:
        self.router.prefill_done(request_id)
        self._close_prefill(self.replica, request_id)
        self._post(["prefill_done", self.replica, request_id])

    def finished(self, request_id: str) -> bool:
        """False when the request was not booked (as the Router answers)."""
        booked = self.router.finished(request_id)
        self._unbook(self.replica, request_id)
        self._post(["finished", self.replica, request_id])
        return booked

    cancelled = finished

    # -- the registry: a worker joining this replica starts with the load the
    # other replicas booked on it, and one that leaves forgets its reports.
    def upsert_worker(self, worker_id: int, role: str, capacity_blocks: int) -> None:
        self.router.upsert_worker(worker_id, role, capacity_blocks)
        self._push(worker_id)

    def remove_worker(self, worker_id: int) -> list[str]:
        self._reported.pop(worker_id, None)
        return self.router.remove_worker(worker_id)

    def report_load(self, worker_id: int, queued_prefill_tokens: int,
                    active_decode_blocks: int, active_requests: int) -> None:
        self._reported[worker_id] = (queued_prefill_tokens, active_decode_blocks,
                                     active_requests)
        self._push(worker_id)

    def knows(self, replica: str, request_id: str) -> bool:
        return request_id in self.books.get(replica, {})

    # -- the shared book
    def _book(self, replica: str, request_id: str, booking: Booking) -> None:
        self._unbook(replica, request_id)
        self.books.setdefault(replica, {})[request_id] = booking
        self._booked_at[replica, request_id] = time.monotonic()
        self._account(booking, +1)

    def _unbook(self, replica: str, request_id: str) -> None:
        booking = self.books.get(replica, {}).pop(request_id, None)
        self._booked_at.pop((replica, request_id), None)
        if booking is not None:
            self._account(booking, -1)

    def _close_prefill(self, replica: str, request_id: str) -> None:
        booking = self.books.get(replica, {}).get(request_id)
        if booking is not None and booking.prefill_open:
            self._account(booking, -1)
            booking.prefill_open = False
            self._account(booking, +1)

    def _account(self, booking: Booking, sign: int) -> None:
        if booking.prefill_open:
            self._totals.setdefault(booking.prefill_worker, [0, 0, 0])[0] += (
                sign * booking.prefill_tokens)
        totals = self._totals.setdefault(booking.decode_worker, [0, 0, 0])
        totals[1] += sign * booking.decode_blocks
        totals[2] += sign
        self._push(booking.prefill_worker)
        self._push(booking.decode_worker)

    def _push(self, worker_id: int) -> None:
        shared = self._totals.get(worker_id, [0, 0, 0])
        reported = self._reported.get(worker_id, (0, 0, 0))
        with contextlib.suppress(KeyError):  # a worker this replica does not route to
            self.router.report_load(worker_id, *(max(a, b) for a, b in zip(
                shared, reported, strict=True)))

    def _expire(self) -> None:
        """Bookings lapse like the policy's own (`stale_after_s`), and a
        silent replica's with it."""
        now = time.monotonic()
        horizon = now - self.router.config.stale_after_s
        for key in [k for k, at in self._booked_at.items() if at < horizon]:
            self._unbook(*key)
        for replica in [r for r, at in self._heard.items()
                        if at < now - 3 * self.book_interval_s]:
            del self._heard[replica]
            for request_id in list(self.books.pop(replica, {})):
                self._unbook(replica, request_id)

    # -- NATS
    def _post(self, message: list) -> None:
        self._outbox.put_nowait(msgspec.msgpack.encode(message))

    async def _send(self) -> None:
        while True:
            data = await self._outbox.get()
            await self.nc.publish(self.nats.load_subject, data)

    async def _announce(self) -> None:
        while True:
            await asyncio.sleep(self.book_interval_s)
            own = self.books[self.replica]
            self._post(["book", self.replica,
                        [[request_id, *astuple(b)] for request_id, b in own.items()]])
            self._expire()

    async def _on_message(self, msg) -> None:
        try:
            kind, replica, *rest = msgspec.msgpack.decode(msg.data)
            if replica != self.replica:
                self._heard[replica] = time.monotonic()
                self._apply_remote(kind, replica, rest)
        except (msgspec.DecodeError, ValueError, TypeError):
            log.warning("ignoring a malformed load message")

    def _apply_remote(self, kind: str, replica: str, rest: list) -> None:
        if kind == "route":
            request_id, *fields = rest
            self._book(replica, request_id, Booking(*fields))
        elif kind == "prefill_done":
            self._close_prefill(replica, rest[0])
        elif kind == "finished":
            self._unbook(replica, rest[0])
        elif kind == "book":
            for request_id in list(self.books.get(replica, {})):
                self._unbook(replica, request_id)
            for request_id, *fields in rest[0]:
                self._book(replica, request_id, Booking(*fields))
