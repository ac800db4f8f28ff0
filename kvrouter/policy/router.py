"""The router: the Python face of the Rust scoring core and load book."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from kvrouter._core import PrefixIndex, RoutingCore
from kvrouter.policy.config import PolicyConfig
from kvrouter.policy.decision import Decision, Explanation
from kvrouter.roles import ROLES


class Router:
    """Routes each request to the workers with the lowest predicted TTFT.

    Thread-safe. `route` charges the chosen workers at once, so a burst of
    requests spreads even before any worker reports load. `clock` (seconds)
    drives stale-booking expiry; the replay simulator passes virtual time.
    `core` is the Rust scoring core, for callers that route through it
    directly (the service's wire path)."""

    def __init__(
        self,
        index: PrefixIndex,
        config: PolicyConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self.config = config or PolicyConfig()
        self.config.validate()
        self.core = RoutingCore(index.block_size, **self.config.core_kwargs())
        self.clock = clock

    # -- registry
    def upsert_worker(self, worker_id: int, role: str, capacity_blocks: int) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        self.core.upsert_worker(worker_id, role, capacity_blocks)

    def remove_worker(self, worker_id: int) -> list[str]:
        """Forgets the worker; returns the ids of requests that were booked on it."""
        return self.core.remove_worker(worker_id)

    def set_healthy(self, worker_id: int, healthy: bool) -> None:
        self.core.set_healthy(worker_id, healthy)

    def report_load(
        self,
        worker_id: int,
        queued_prefill_tokens: int,
        active_decode_blocks: int,
        active_requests: int,
    ) -> None:
        self.core.report_load(
            worker_id, queued_prefill_tokens, active_decode_blocks, active_requests
        )

    # -- calibration: timings the workers measured
    def report_prefill_timing(
        self, new_tokens: int, cached_tokens: int, duration_ms: float
    ) -> None:
        self.core.observe_prefill(new_tokens, cached_tokens, duration_ms)

    def report_decode_step(self, active_blocks: int, duration_ms: float) -> None:
        self.core.observe_decode_step(active_blocks, duration_ms)

    def report_transfer(self, blocks: int, duration_ms: float) -> None:
        self.core.observe_transfer(blocks, duration_ms)

    def coefficients(self) -> dict[str, float]:
        return self.core.coefficients()

    def load(self, worker_id: int) -> tuple[int, int, int]:
        """(queued prefill tokens, active decode blocks, active requests) as scored."""
        return self.core.load(worker_id)

    # -- routing
    def route(
        self,
        request_id: str,
        tokens,
        namespace: str = "",
        *,
        hashes: Sequence[int] | None = None,
        num_tokens: int | None = None,
    ) -> Decision:
        """Picks the workers for a request and books its load on them.

        `tokens` are the prompt's token ids; a caller that already holds the
        block hashes passes `hashes` (and `num_tokens`) with tokens None.
        Raises NoWorkerAvailable, or ValueError for a request id in flight."""
        (decode, prefill, ttft, prefill_tokens, num_blocks, reason, decode_rows, prefill_rows) = (
            self.core.route(
                self.index,
                request_id,
                tokens if hashes is None else None,
                hashes=hashes,
                num_tokens=num_tokens,
                namespace=namespace,
                now_s=self.clock(),
                approximate_ttl_s=self.config.approximate_ttl_s,
            )
        )
        return Decision(
            request_id=request_id,
            prefill_worker=prefill,
            decode_worker=decode,
            disaggregated=prefill is not None,
            explanation=Explanation.from_rows(reason, decode_rows, prefill_rows),
            num_blocks=num_blocks,
            prefill_tokens=prefill_tokens,
            predicted_ttft_ms=ttft,
        )

    def prefill_done(self, request_id: str) -> None:
        self.core.prefill_done(request_id)

    def finished(self, request_id: str) -> bool:
        """Frees the request's load; False when it was not booked."""
        return self.core.release(request_id)

    def cancelled(self, request_id: str) -> bool:
        """Frees the request's load; False when it was not booked."""
        return self.core.release(request_id)

    def __len__(self) -> int:
        """Requests booked and not yet finished."""
        return len(self.core)
