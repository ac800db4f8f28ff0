"""Policies the replay compares: baselines and ours (kvrouter.policy.Router).

Baselines keep the router-side bookkeeping a real router has (what it sent
and has not seen finish); none of them looks inside the simulated workers.
In P/D mode a baseline always disaggregates, choosing each side by its rule."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

from kvrouter._core import PrefixIndex
from kvrouter.policy import PolicyConfig, Router
from kvrouter.replay.worker import SimRequest, SimWorker

POLICIES = ("round_robin", "random", "least_loaded", "overlap_only", "dynamo", "kvrouter")


class _Book:
    """Per worker: uncached prefill tokens not yet done, active blocks and
    requests, as charged at routing time."""

    def __init__(self) -> None:
        self.prefill: dict[int, int] = {}
        self.blocks: dict[int, int] = {}
        self.requests: dict[int, int] = {}
        self.open: dict[str, tuple[int, int, int, int]] = {}

    def charge(self, rid: str, prefill: int, decode: int, tokens: int, blocks: int) -> None:
        self.prefill[prefill] = self.prefill.get(prefill, 0) + tokens
        self.blocks[decode] = self.blocks.get(decode, 0) + blocks
        self.requests[decode] = self.requests.get(decode, 0) + 1
        self.open[rid] = (prefill, decode, tokens, blocks)

    def prefill_done(self, rid: str) -> None:
        prefill, decode, tokens, blocks = self.open[rid]
        self.prefill[prefill] -= tokens
        self.open[rid] = (prefill, decode, 0, blocks)

    def finished(self, rid: str) -> None:
        prefill, decode, tokens, blocks = self.open.pop(rid)
        self.prefill[prefill] -= tokens
        self.blocks[decode] -= blocks
        self.requests[decode] -= 1


class Baseline:
    uses_index = False

    def __init__(self, name: str, workers: list[SimWorker], index: PrefixIndex, seed: int) -> None:
        self.name = name
        self.index = index
        self.block_size = index.block_size
        self.prefill_pool = [w.id for w in workers if w.role == "prefill"]
        self.decode_pool = [w.id for w in workers if w.role != "prefill"]
        self.book = _Book()
        self.rng = random.Random(seed)
        self.turn = itertools.count()

    def score(self, worker: int, request: SimRequest, overlap: dict[int, int]) -> float:
        raise NotImplementedError

    def _choose(self, pool: list[int], request: SimRequest, overlap: dict[int, int]) -> int:
        scores = [self.score(w, request, overlap) for w in pool]
        best = min(scores)
        tied = [w for w, s in zip(pool, scores, strict=True) if s == best]
        return tied[0] if len(tied) == 1 else self.rng.choice(tied)

    def route(self, rid: str, request: SimRequest, now: float) -> tuple[int | None, int]:
        overlap = self.index.find_matches(request.hashes).scores if self.uses_index else {}
        decode = self._choose(self.decode_pool, request, overlap)
        prefill = self._choose(self.prefill_pool, request, overlap) if self.prefill_pool else None
        side = decode if prefill is None else prefill
        uncached = max(request.input_length - overlap.get(side, 0) * self.block_size, 0)
        self.book.charge(rid, side, decode, uncached, len(request.blocks))
        return prefill, decode

    def prefill_done(self, rid: str) -> None:
        self.book.prefill_done(rid)

    def finished(self, rid: str) -> None:
        self.book.finished(rid)

    def observe(self, worker: SimWorker, outcome) -> None:
        """Baselines take no worker reports."""


class RoundRobin(Baseline):
    def _choose(self, pool, request, overlap):
        return pool[next(self.turn) % len(pool)]


class Random(Baseline):
    def _choose(self, pool, request, overlap):
        return self.rng.choice(pool)


class LeastLoaded(Baseline):
    def score(self, worker, request, overlap):
        return self.book.requests.get(worker, 0)


class OverlapOnly(Baseline):
    uses_index = True

    def score(self, worker, request, overlap):
        # Most cached blocks first; among equals, the fewest active requests.
        return -overlap.get(worker, 0) + self.book.requests.get(worker, 0) * 1e-6


class DynamoCost(Baseline):
    """Dynamo's default KV router cost: prefill blocks - overlap + decode blocks."""

    uses_index = True

    def score(self, worker, request, overlap):
        new_blocks = len(request.blocks) - overlap.get(worker, 0)
        queued = self.book.prefill.get(worker, 0) / self.block_size
        return queued + new_blocks + self.book.blocks.get(worker, 0)


class Ours:
    """kvrouter.policy.Router, fed the load and timings workers report."""

    uses_index = True

    def __init__(self, workers: list[SimWorker], index: PrefixIndex, config: PolicyConfig,
                 clock: Callable[[], float]) -> None:  # fmt: skip
        self.name = "kvrouter"
        self.router = Router(index, config, clock=clock)
        for w in workers:
            self.router.upsert_worker(w.id, w.role, w.cache.capacity)

    def route(self, rid: str, request: SimRequest, now: float) -> tuple[int | None, int]:
        d = self.router.route(rid, None, hashes=request.hashes, num_tokens=request.input_length)
        return d.prefill_worker, d.decode_worker

    def prefill_done(self, rid: str) -> None:
        self.router.prefill_done(rid)

    def finished(self, rid: str) -> None:
        self.router.finished(rid)

    def observe(self, worker: SimWorker, outcome) -> None:
        r = self.router
        for new, cached, ms in outcome.prefill_samples:
            r.report_prefill_timing(new, cached, ms)
        if outcome.decode_sample is not None:
            r.report_decode_step(*outcome.decode_sample)
        active = len(worker.waiting) + len(worker.prefilling) + len(worker.running)
        r.report_load(worker.id, worker.queued_prefill_tokens(), worker.cache.active, active)


BASELINES = {
    "round_robin": RoundRobin,
    "random": Random,
    "least_loaded": LeastLoaded,
    "overlap_only": OverlapOnly,
    "dynamo": DynamoCost,
}


def make_policy(name, workers, index, config: PolicyConfig, seed: int, clock):
    if name == "kvrouter":
        return Ours(workers, index, config, clock)
    if name not in BASELINES:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    return BASELINES[name](name, workers, index, seed)
