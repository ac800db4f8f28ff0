"""A complete router replica on NATS: its own index fed from the event
stream, a router whose load book also holds the other replicas' bookings,
and worker ids from the counter the replicas share."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import nats

from kvrouter._core import PrefixIndex
from kvrouter.adapters.nats.config import NatsConfig
from kvrouter.policy import PolicyConfig, Router
from kvrouter.service.replicas.load_share import BookingExchange
from kvrouter.service.replicas.replica import IndexReplica
from kvrouter.service.replicas.shared_ids import SharedIdCounter, id_bucket


class RouterReplica:
    """`async with RouterReplica(config, "router-a") as replica:` then route
    with `replica.router` (a `kvrouter.policy.Router`) and read `replica.index`.
    `make_router(index)` builds the router; it must pass `share_bookings=True`
    (by default, a Router with the `policy` settings)."""

    def __init__(
        self,
        config: NatsConfig,
        name: str,
        *,
        policy: PolicyConfig | None = None,
        block_size: int = 16,
        max_blocks: int | None = None,
        snapshot_path: str | Path | None = None,
        snapshot_interval_s: float = 30.0,
        on_bad_snapshot: str = "empty",
        book_interval_s: float = 2.0,
        make_router: Callable[[PrefixIndex], Router] | None = None,
    ) -> None:
        self.config = config
        self.name = name
        self.policy = policy
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.snapshot_path = snapshot_path
        self.snapshot_interval_s = snapshot_interval_s
        self.on_bad_snapshot = on_bad_snapshot
        self.book_interval_s = book_interval_s
        self.nc = None
        self.events: IndexReplica | None = None
        self.make_router = make_router or (lambda index: Router(index, policy, share_bookings=True))
        self.router: Router | None = None
        self.exchange: BookingExchange | None = None
        self.worker_ids: SharedIdCounter | None = None

    @property
    def index(self):
        return self.events.index

    async def start(self) -> None:
        self.nc = await nats.connect(servers=list(self.config.servers), name=self.name)
        self.events = IndexReplica(
            self.nc,
            self.config,
            self.name,
            block_size=self.block_size,
            max_blocks=self.max_blocks,
            snapshot_path=self.snapshot_path,
            snapshot_interval_s=self.snapshot_interval_s,
            on_bad_snapshot=self.on_bad_snapshot,
        )
        await self.events.start()
        # Its floor is the mark the replica restored from its snapshot.
        self.worker_ids = SharedIdCounter(await id_bucket(self.nc, self.config), self.events)
        # The router reads the index the replica restored or created.
        self.router = self.make_router(self.events.index)
        self.exchange = BookingExchange(
            self.router, self.nc, self.config, self.name, book_interval_s=self.book_interval_s
        )
        await self.exchange.start()

    async def stop(self, snapshot: bool = True) -> None:
        if self.exchange is not None:
            await self.exchange.stop()
        if self.events is not None:
            await self.events.stop(snapshot=snapshot)
        if self.nc is not None:
            await self.nc.flush()
            await self.nc.close()

    async def __aenter__(self) -> RouterReplica:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()
