"""The router: registry of workers, load book and cost-based selection."""

from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass

from kvrouter._core import PrefixIndex, hash_tokens
from kvrouter.policy.config import PolicyConfig
from kvrouter.policy.decision import CandidateCost, Decision, Explanation, NoWorkerAvailable

ROLES = ("prefill", "decode", "both")


@dataclass
class _Worker:
    role: str
    capacity_blocks: int
    healthy: bool = True
    reported_prefill_tokens: int = 0
    reported_decode_blocks: int = 0
    reported_requests: int = 0
    booked_prefill_tokens: int = 0
    booked_decode_blocks: int = 0
    booked_requests: int = 0


@dataclass
class _Booking:
    prefill_worker: int
    decode_worker: int
    prefill_tokens: int
    decode_blocks: int
    prefill_open: bool
    at: float


class Router:
    """Routes requests to the workers with the lowest predicted TTFT.

    Thread-safe. `route` charges the chosen workers at once, so a burst of
    requests spreads even before any worker reports load."""

    def __init__(self, index: PrefixIndex, config: PolicyConfig | None = None) -> None:
        self.index = index
        self.config = config or PolicyConfig()
        self.config.validate()
        self._workers: dict[int, _Worker] = {}
        self._book: dict[str, _Booking] = {}
        self._lock = threading.Lock()
        self._rng = random.Random(self.config.seed)
        self._turn = 0

    # -- registry
    def upsert_worker(self, worker_id: int, role: str, capacity_blocks: int) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if capacity_blocks <= 0:
            raise ValueError(f"capacity_blocks must be positive, got {capacity_blocks}")
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None:
                self._workers[worker_id] = _Worker(role, capacity_blocks)
            else:
                worker.role, worker.capacity_blocks = role, capacity_blocks

    def remove_worker(self, worker_id: int) -> None:
        with self._lock:
            self._require(worker_id)
            del self._workers[worker_id]
            for request_id in [r for r, b in self._book.items() if worker_id in
                               (b.prefill_worker, b.decode_worker)]:
                self._release(request_id)

    def set_healthy(self, worker_id: int, healthy: bool) -> None:
        with self._lock:
            self._require(worker_id).healthy = healthy

    def report_load(
        self,
        worker_id: int,
        queued_prefill_tokens: int,
        active_decode_blocks: int,
        active_requests: int,
    ) -> None:
        with self._lock:
            worker = self._require(worker_id)
            worker.reported_prefill_tokens = queued_prefill_tokens
            worker.reported_decode_blocks = active_decode_blocks
            worker.reported_requests = active_requests

    # -- routing
    def route(self, request_id: str, tokens, namespace: str = "") -> Decision:
        hashes = hash_tokens(tokens, self.index.block_size, namespace)
        num_tokens = len(tokens)
        tiers = self.index.find_matches(hashes).tiers
        with self._lock:
            self._expire(time.monotonic())
            if request_id in self._book:
                raise ValueError(f"request {request_id!r} is already routed")
            decision = self._select(request_id, num_tokens, len(hashes), tiers)
            self._charge(decision, num_tokens, tiers)
        if self.config.approximate_ttl_s > 0 and hashes:
            self.index.insert_approximate(decision.decode_worker, hashes,
                                          self.config.approximate_ttl_s)
        return decision

    def prefill_done(self, request_id: str) -> None:
        with self._lock:
            booking = self._book.get(request_id)
            if booking is None or not booking.prefill_open:
                return
            booking.prefill_open = False
            worker = self._workers.get(booking.prefill_worker)
            if worker is not None:
                worker.booked_prefill_tokens -= booking.prefill_tokens

    def finished(self, request_id: str) -> None:
        with self._lock:
            self._release(request_id)

    cancelled = finished

    # -- internals
    def _require(self, worker_id: int) -> _Worker:
        worker = self._workers.get(worker_id)
        if worker is None:
            raise KeyError(f"unknown worker {worker_id}")
        return worker

    def _cost(self, worker_id: int, worker: _Worker, num_tokens: int,
              tiers: dict) -> CandidateCost:
        cfg = self.config
        device, host, disk = tiers.get(worker_id, (0, 0, 0))
        cached = (device + host + disk) * self.index.block_size
        new = max(num_tokens - cached, 0)
        queued = max(worker.booked_prefill_tokens, worker.reported_prefill_tokens)
        queue_ms = cfg.prefill_ms_per_token * queued
        prefill_ms = cfg.prefill_ms_per_token * new + cfg.attention_ms_per_token2 * new * (
            cached + new / 2)
        reload_ms = host * cfg.host_reload_ms_per_block + disk * cfg.disk_reload_ms_per_block
        decode_blocks = max(worker.booked_decode_blocks, worker.reported_decode_blocks)
        decode_ms = cfg.decode_ms_per_block * decode_blocks
        return CandidateCost(worker_id, worker.role, device, host, disk,
                             queue_ms + prefill_ms + reload_ms + decode_ms,
                             queue_ms, prefill_ms, reload_ms, decode_ms)

    def _select(self, request_id: str, num_tokens: int, num_blocks: int,
                tiers: dict) -> Decision:
        candidates = [
            self._cost(wid, w, num_tokens, tiers)
            for wid, w in self._workers.items()
            if w.healthy and w.role != "prefill" and w.capacity_blocks >= num_blocks
        ]
        if not candidates:
            raise NoWorkerAvailable(
                f"no healthy decode-capable worker with room for {num_blocks} blocks "
                f"({len(self._workers)} registered)")
        winner, reason = self._pick(candidates)
        return Decision(request_id=request_id, decode_worker=winner.worker_id,
                        num_blocks=num_blocks, predicted_ttft_ms=winner.cost_ms,
                        explanation=Explanation(reason, candidates))

    def _pick(self, candidates: list[CandidateCost]) -> tuple[CandidateCost, str]:
        best = min(c.cost_ms for c in candidates)
        if self.config.temperature > 0 and len(candidates) > 1:
            scale = max(best, 1.0) * self.config.temperature
            weights = [math.exp(-(c.cost_ms - best) / scale) for c in candidates]
            winner = self._rng.choices(candidates, weights)[0]
            return winner, f"sampled at temperature {self.config.temperature}"
        limit = best * (1 + self.config.tie_tolerance) + 1e-9
        tied = [c for c in candidates if c.cost_ms <= limit]
        if len(tied) == 1:
            return tied[0], "lowest predicted TTFT"
        fewest = min(self._active(c.worker_id) for c in tied)
        tied = [c for c in tied if self._active(c.worker_id) == fewest]
        self._turn += 1
        return tied[self._turn % len(tied)], f"tie among {len(tied)}: fewest active, round-robin"

    def _active(self, worker_id: int) -> int:
        w = self._workers[worker_id]
        return max(w.booked_requests, w.reported_requests)

    def _charge(self, decision: Decision, num_tokens: int, tiers: dict) -> None:
        winner = next(c for c in decision.explanation.decode_candidates
                      if c.worker_id == decision.decode_worker)
        new_tokens = max(num_tokens - winner.overlap * self.index.block_size, 0)
        worker = self._workers[decision.decode_worker]
        worker.booked_prefill_tokens += new_tokens
        worker.booked_decode_blocks += decision.num_blocks
        worker.booked_requests += 1
        self._book[decision.request_id] = _Booking(
            decision.decode_worker, decision.decode_worker, new_tokens, decision.num_blocks,
            True, time.monotonic())

    def _release(self, request_id: str) -> None:
        booking = self._book.pop(request_id, None)
        if booking is None:
            return
        prefill = self._workers.get(booking.prefill_worker)
        if prefill is not None and booking.prefill_open:
            prefill.booked_prefill_tokens -= booking.prefill_tokens
        decode = self._workers.get(booking.decode_worker)
        if decode is not None:
            decode.booked_decode_blocks -= booking.decode_blocks
            decode.booked_requests -= 1

    def _expire(self, now: float) -> None:
        horizon = now - self.config.stale_after_s
        for request_id in [r for r, b in self._book.items() if b.at < horizon]:
            self._release(request_id)
