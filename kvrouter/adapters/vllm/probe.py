"""Liveness and load of an engine the sidecar does not drive: its `/health`
and `/metrics` (vLLM's and SGLang's OpenAI servers both serve them), polled
every `interval_s`.

A worker's heartbeat is sent only while its engine's last probe succeeded
within one heartbeat interval (`load_for` is None otherwise), so a dead or
hung engine stops heartbeating at the next beat, and the router drops it
within its heartbeat TTL of the last good probe, hence of the failure.
When the engine answers again the heartbeats resume, and the router, which
forgot the worker, has it register again.

Load is looked up by the global DP rank, which vLLM's `engine` label
carries; a page naming ranks but not the worker's (a node's
`data_parallel_start_rank` left out) is logged once, and the worker
reports the rank-less series or none."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import aiohttp

from kvrouter.adapters.vllm.engine_load import engine_loads
from kvrouter.client.types import WorkerLoad

log = logging.getLogger("kvrouter.adapters.vllm.probe")


class EngineProbe:
    def __init__(
        self,
        name: str,
        address: str,
        capacity_blocks: int,
        *,
        interval_s: float,
        timeout_s: float,
    ) -> None:
        """`address` is the engine's HTTP base URL (`http://host:port`)."""
        self.name = name
        self.base = address.rstrip("/")
        self.capacity_blocks = capacity_blocks
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.healthy_at: float | None = None
        self.loads: dict[int | None, WorkerLoad] = {}
        self.failures = 0
        self._unlabelled: set[int] = set()
        self._task: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        await self.probe()
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.probe()

    async def probe(self) -> bool:
        """One probe: /health, then /metrics for the load. A failed metrics
        read keeps the last load: liveness is /health's alone."""
        try:
            async with self._session.get(f"{self.base}/health") as response:
                if response.status != 200:
                    raise ConnectionError(f"/health answered {response.status}")
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            self._failed(str(e) or type(e).__name__)
            return False
        if self.failures:
            log.info("engine answers again", extra={"fields": {"engine": self.name}})
        self.failures = 0
        self.healthy_at = time.monotonic()
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
            async with self._session.get(f"{self.base}/metrics") as response:
                if response.status == 200:
                    self.loads = engine_loads(await response.text(), self.capacity_blocks)
        return True

    def _failed(self, error: str) -> None:
        if not self.failures:
            log.warning(
                "engine failed its health probe; its workers stop heartbeating",
                extra={"fields": {"engine": self.name, "address": self.base, "error": error}},
            )
        self.failures += 1

    def load_for(self, dp_rank: int, within_s: float) -> WorkerLoad | None:
        """The rank's load if the engine was healthy within `within_s`, else
        None (no heartbeat)."""
        if self.healthy_at is None or time.monotonic() - self.healthy_at > within_s:
            return None
        load = self.loads.get(dp_rank)
        if load is not None:
            return load
        ranks = sorted(rank for rank in self.loads if rank is not None)
        if ranks and dp_rank not in self._unlabelled:
            self._unlabelled.add(dp_rank)
            log.warning(
                "the engine's /metrics names other DP ranks than this worker's; "
                "check its data_parallel_start_rank",
                extra={"fields": {"engine": self.name, "dp_rank": dp_rank, "page_ranks": ranks}},
            )
        return self.loads.get(None) or WorkerLoad()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None
