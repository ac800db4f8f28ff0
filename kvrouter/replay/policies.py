"""The policies the replay compares, all of them the core's
(`kvrouter.policy.Router`, chosen by name): kvrouter's own and the baselines.

Every policy keeps the router-side bookkeeping a real router has (what it
sent and has not seen finish). Only kvrouter's takes the simulated workers'
load reports and timings; the baselines look at nothing inside the workers,
as the routers they stand for do not. In P/D mode a baseline always
disaggregates, choosing each side by its rule."""

from __future__ import annotations

from collections.abc import Callable

from kvrouter._core import Decision, PrefixIndex
from kvrouter.policy import POLICIES, PolicyConfig, Router
from kvrouter.replay.worker import SimRequest, SimWorker

__all__ = ["POLICIES", "ReplayPolicy", "make_policy"]


class ReplayPolicy:
    """One policy as the replay drives it: routed by block hashes on the
    replay's virtual clock."""

    def __init__(
        self,
        name: str,
        workers: list[SimWorker],
        index: PrefixIndex,
        config: PolicyConfig,
        clock: Callable[[], float],
    ) -> None:
        self.name = name
        self.router = Router(index, config, clock=clock)
        self.uses_index = self.router.uses_index
        self.takes_reports = name == "kvrouter"
        for w in workers:
            self.router.upsert_worker(w.id, w.role, w.cache.capacity)

    def route(self, rid: str, request: SimRequest) -> Decision:
        return self.router.route(rid, hashes=request.hashes, num_tokens=request.input_length)

    def prefill_done(self, rid: str) -> None:
        self.router.prefill_done(rid)

    def finished(self, rid: str) -> None:
        self.router.finished(rid)

    def observe(self, worker: SimWorker, outcome) -> None:
        """Feeds the worker's timings and load to a policy that takes them."""
        if not self.takes_reports:
            return
        r = self.router
        for new, cached, ms in outcome.prefill_samples:
            r.report_prefill_timing(new, cached, ms)
        if outcome.decode_sample is not None:
            r.report_decode_step(*outcome.decode_sample)
        active = len(worker.waiting) + len(worker.running)
        r.report_load(worker.id, worker.queued_prefill_tokens(), worker.cache.active, active)


def make_policy(
    name: str,
    workers: list[SimWorker],
    index: PrefixIndex,
    config: PolicyConfig,
    seed: int,
    clock: Callable[[], float],
) -> ReplayPolicy:
    """`config` for kvrouter; a baseline takes only `seed` (for its ties)."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    settings = (
        config.replace(policy=name) if name == "kvrouter" else PolicyConfig(policy=name, seed=seed)
    )
    return ReplayPolicy(name, workers, index, settings, clock)
