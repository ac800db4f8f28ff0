"""The replay loop: arrivals, engine stretches, KV hand-offs and KV events
on one virtual clock (ms)."""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvrouter._core import Decision, PrefixIndex, Removed, Stored, chain_hashes
from kvrouter.policy import PolicyConfig
from kvrouter.replay.policies import make_policy
from kvrouter.replay.report import summarize
from kvrouter.replay.timing import TimingModel
from kvrouter.replay.trace import TraceRequest, engine_blocks
from kvrouter.replay.worker import SimRequest, SimWorker

INF = float("inf")


@dataclass
class ReplayConfig:
    num_workers: int = 8
    # P/D mode when num_prefill_workers > 0: that many prefill workers plus
    # num_workers decode workers.
    num_prefill_workers: int = 0
    capacity_blocks: int = 16_384
    block_size: int = 64
    trace_block_size: int = 512
    # KV events reach the router this long after the engine emits them.
    event_lag_ms: float = 0.0
    timing: TimingModel = field(default_factory=TimingModel)
    policy_config: PolicyConfig = field(default_factory=PolicyConfig)
    seed: int = 0
    # Called with each request and the policy's decision as it is routed,
    # for tools that study the decisions (the explanation included).
    on_decision: Callable[[SimRequest, Decision], None] | None = None


def _workers(cfg: ReplayConfig) -> list[SimWorker]:
    def make(wid, role):
        return SimWorker(wid, role, cfg.capacity_blocks, cfg.block_size, cfg.timing)

    if cfg.num_prefill_workers:
        prefill = [make(i, "prefill") for i in range(cfg.num_prefill_workers)]
        decode = [make(cfg.num_prefill_workers + i, "decode") for i in range(cfg.num_workers)]
        return prefill + decode
    return [make(i, "both") for i in range(cfg.num_workers)]


def replay(trace: list[TraceRequest], policy: str, cfg: ReplayConfig, progress=None) -> dict:
    """Replays the trace under one policy; returns the summary report.
    `progress` is called with the number of requests routed since the last call."""
    wall = time.perf_counter()
    requests, workers = _simulate(trace, policy, cfg, progress)
    return summarize(policy, requests, workers, cfg, time.perf_counter() - wall)


def replay_requests(trace: list[TraceRequest], policy: str, cfg: ReplayConfig) -> list[SimRequest]:
    """Replays the trace under one policy; returns its requests, finished,
    in the trace's order."""
    return _simulate(trace, policy, cfg, None)[0]


def _simulate(
    trace: list[TraceRequest], policy: str, cfg: ReplayConfig, progress
) -> tuple[list[SimRequest], list[SimWorker]]:
    workers = _workers(cfg)
    index = PrefixIndex(cfg.block_size, manual_clock=True)
    clock = [0.0]
    chooser = make_policy(
        policy, workers, index, cfg.policy_config, cfg.seed, lambda: clock[0] / 1000
    )
    events: list = []  # (time, order, kind, payload)
    order = itertools.count()
    handoffs: list[float] = []  # pending hand-off times, a heap
    requests: list[SimRequest] = []
    rr = trace
    workers_by_id = {w.id: w for w in workers}
    timing = cfg.timing

    def deliver(worker: SimWorker, stored, removed) -> None:
        if not chooser.uses_index or not (stored or removed):
            return
        batch = []
        if removed:
            batch.append(Removed(removed))
        batch += [Stored(blocks, local_hashes=blocks, parent=p) for p, blocks in stored]
        item = (worker.id, worker.event_seq, batch)
        worker.event_seq += 1
        if cfg.event_lag_ms > 0:
            heapq.heappush(events, (clock[0] + cfg.event_lag_ms, next(order), "kv", item))
        else:
            index.apply(*item)

    def kick(worker: SimWorker, now: float) -> None:
        if worker.busy:
            return
        horizon = rr[i].arrival_ms if i < len(rr) else INF
        if handoffs:
            horizon = min(horizon, handoffs[0])
        end = worker.start_step(now, horizon)
        if end is not None:
            heapq.heappush(events, (end, next(order), "step", worker))

    i = 0
    arrived: list[SimWorker] = []  # workers given requests at the current instant
    routed_since = 0
    while i < len(rr) or events:
        next_arrival = rr[i].arrival_ms if i < len(rr) else INF
        if events and events[0][0] <= next_arrival:
            now, _, kind, payload = heapq.heappop(events)
            clock[0] = now
            if kind == "step":
                worker = payload
                out = worker.finish_step()
                deliver(worker, out.stored, out.removed)
                for r in out.prefilled:
                    chooser.prefill_done(r.id)
                    if worker.role == "prefill" and r.remaining > 0:
                        # Only the blocks the decode worker lacks travel.
                        held = workers_by_id[r.decode_worker].cache.hit_length(r.blocks)
                        missing = len(r.blocks) - held
                        at = now + missing * timing.transfer_ms_per_block
                        heapq.heappush(handoffs, at)
                        heapq.heappush(events, (at, next(order), "handoff", r))
                for r in out.completed:
                    if worker.role != "prefill" or r.remaining <= 0:
                        r.done_at = r.done_at or now
                        chooser.finished(r.id)
                chooser.observe(worker, out)
                kick(worker, now)
            elif kind == "handoff":
                heapq.heappop(handoffs)
                payload.decode_only = True
                target = workers_by_id[payload.decode_worker]
                target.enqueue(payload)
                kick(target, now)
            else:
                index.apply(*payload)
            continue
        t = rr[i]
        clock[0] = now = t.arrival_ms
        blocks = engine_blocks(t, cfg.trace_block_size, cfg.block_size)
        r = SimRequest(str(i), now, t.input_length, t.output_length, blocks)
        r.hashes = chain_hashes(blocks) if chooser.uses_index else blocks
        i += 1
        index.set_time(now / 1000)
        decision = chooser.route(r.id, r)
        prefill, decode = decision.prefill_worker, decision.decode_worker
        r.prefill_worker, r.decode_worker = prefill, decode
        if cfg.on_decision is not None:
            cfg.on_decision(r, decision)
        requests.append(r)
        target = workers_by_id[decode if prefill is None else prefill]
        target.enqueue(r)
        arrived.append(target)
        # The engine takes every request of the same instant into its next
        # iteration, so no worker starts before the last of them is routed.
        if i == len(rr) or rr[i].arrival_ms != now:
            for w in arrived:
                kick(w, now)
            arrived.clear()
        routed_since += 1
        if progress is not None and routed_since >= 256:
            progress(routed_since)
            routed_since = 0
    if progress is not None and routed_since:
        progress(routed_since)
    return requests, workers
