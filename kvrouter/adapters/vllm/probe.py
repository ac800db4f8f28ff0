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
reports the rank-less series or none.

A rank's KV capacity is its engine entry's `capacity_blocks` where set,
else what the engine's page last stated (vLLM's `vllm:cache_config_info`,
SGLang's `sglang:max_total_num_tokens`) in whole blocks of the router's
size, else `DEFAULT_CAPACITY_BLOCKS`, logged once a page has been read
that names the rank and states none. `on_read` is called after each page
read, so that the sidecar can register a rank again when its engine
restarts with another cache size."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import aiohttp

from kvrouter.adapters.vllm.config import DEFAULT_CAPACITY_BLOCKS
from kvrouter.adapters.vllm.engine_load import RankReading, read_engine_page
from kvrouter.client.types import WorkerLoad

log = logging.getLogger("kvrouter.adapters.vllm.probe")


class EngineProbe:
    def __init__(
        self,
        name: str,
        address: str,
        capacity_blocks: int | None,
        *,
        block_size: int,
        interval_s: float,
        timeout_s: float,
        on_read: Callable[[], None] | None = None,
    ) -> None:
        """`address` is the engine's HTTP base URL (`http://host:port`);
        `capacity_blocks` its entry's, None to read it from the engine."""
        self.name = name
        self.base = address.rstrip("/")
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.on_read = on_read
        self.healthy_at: float | None = None
        self.readings: dict[int | None, RankReading] = {}
        self.pages_read = 0
        self.failures = 0
        self._unlabelled: set[int] = set()
        self._unstated: set[int] = set()
        # Per rank, the capacity in blocks its engine last stated.
        self._stated: dict[int, int] = {}
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
                if response.status != 200:
                    return True
                self.readings = read_engine_page(await response.text())
                self.pages_read += 1
        if self.pages_read and self.on_read is not None:
            self.on_read()
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
        reading = self.readings.get(dp_rank)
        if reading is None:
            ranks = sorted(rank for rank in self.readings if rank is not None)
            if ranks and dp_rank not in self._unlabelled:
                self._unlabelled.add(dp_rank)
                log.warning(
                    "the engine's /metrics names other DP ranks than this worker's; "
                    "check its data_parallel_start_rank",
                    extra={
                        "fields": {"engine": self.name, "dp_rank": dp_rank, "page_ranks": ranks}
                    },
                )
            reading = self.readings.get(None)
        return WorkerLoad() if reading is None else reading.load(self.capacity_for(dp_rank))

    def capacity_for(self, dp_rank: int) -> int:
        """The rank's KV capacity in blocks (see the module note): the last
        its engine stated, so that a page missing the figure now and then
        does not send the routers back to the default."""
        if self.capacity_blocks is not None:
            return self.capacity_blocks
        reading = self.readings.get(dp_rank) or self.readings.get(None)
        tokens = None if reading is None else reading.capacity_tokens
        if tokens is not None and tokens >= self.block_size:
            self._stated[dp_rank] = tokens // self.block_size
        stated = self._stated.get(dp_rank)
        if stated is not None:
            return stated
        # A rank the page does not name is logged as such by `load_for`.
        if self.pages_read and reading is not None and dp_rank not in self._unstated:
            self._unstated.add(dp_rank)
            log.warning(
                "the engine's /metrics states no KV capacity for this rank, and its entry "
                "sets no capacity_blocks: assuming the default",
                extra={
                    "fields": {
                        "engine": self.name,
                        "dp_rank": dp_rank,
                        "capacity_blocks": DEFAULT_CAPACITY_BLOCKS,
                    }
                },
            )
        return DEFAULT_CAPACITY_BLOCKS

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None
