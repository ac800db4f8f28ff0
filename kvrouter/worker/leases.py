"""Prefilled hand-offs whose blocks stay pinned for a decode worker to fetch.

A lease is created on the engine thread in the same call that pins the
blocks, so no cancellation can strand a pin without a lease. It ends with
Release, or when its TTL passes without one."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

from kvrouter.worker.engine_loop import EngineLoop

log = logging.getLogger("kvrouter.worker.leases")


@dataclass(frozen=True)
class Lease:
    request_id: str
    block_ids: list[int]
    expires_at: float


class LeaseTable:
    def __init__(self, engine: EngineLoop, ttl_s: float) -> None:
        self.engine = engine
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._leases: dict[str, Lease] = {}

    def add(self, request_id: str, block_ids: list[int]) -> Lease:
        """Records pinned blocks (called on the engine thread, right after pinning)."""
        lease = Lease(request_id, list(block_ids), time.monotonic() + self.ttl_s)
        with self._lock:
            self._leases[request_id] = lease
        return lease

    def get(self, request_id: str) -> Lease | None:
        with self._lock:
            return self._leases.get(request_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)

    @property
    def num_blocks(self) -> int:
        with self._lock:
            return sum(len(lease.block_ids) for lease in self._leases.values())

    def take(self, request_id: str) -> Lease | None:
        """Removes a lease; the caller unpins its blocks on the engine thread."""
        with self._lock:
            return self._leases.pop(request_id, None)

    async def release(self, request_id: str, reason: str) -> bool:
        """Unpins a lease's blocks; False when there is none (released or expired)."""
        lease = self.take(request_id)
        if lease is None:
            return False
        await self.engine.call(_unpin, lease.block_ids)
        log.info(
            "hand-off released",
            extra={
                "fields": {"request_id": request_id, "blocks": len(lease.block_ids), "why": reason}
            },
        )
        return True

    async def expire_forever(self) -> None:
        period = min(1.0, self.ttl_s / 4)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            with self._lock:
                lapsed = [rid for rid, lease in self._leases.items() if lease.expires_at <= now]
            for request_id in lapsed:
                await self.release(request_id, "lease expired")


def _unpin(engine, block_ids: list[int]) -> None:
    engine.unpin_blocks(block_ids)
