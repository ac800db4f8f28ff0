"""A simulated engine: a KV cache plus the batching loop of timing.py.

The simulator calls `start_step(now, horizon)` on an idle worker, which plans
the next stretch of work and returns when it ends, then `finish_step()` at
that time. A stretch is one iteration when it carries prefill, or a run of
pure-decode iterations that stops at the first completion or the first
iteration end past `horizon` (the next arrival), so requests join and leave
exactly at iteration boundaries without simulating every decode step."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from kvrouter.replay.cache import BlockCache
from kvrouter.replay.timing import TimingModel

INF = float("inf")


class SimRequest:
    __slots__ = (
        "id", "arrival", "input_length", "output_length", "blocks", "private",
        "hashes", "hit", "prefilled", "remaining", "kv_tokens", "first_token",
        "done_at", "prefill_worker", "decode_worker", "decode_only", "reused",
    )  # fmt: skip

    def __init__(self, rid, arrival, input_length, output_length, blocks, block_size):
        self.id = rid
        self.arrival = arrival
        self.input_length = input_length
        self.output_length = output_length
        self.blocks = blocks
        total = -(-(input_length + output_length) // block_size)
        self.private = max(total - len(blocks), 0)
        self.hashes = None
        self.hit = 0
        self.prefilled = 0
        self.remaining = output_length
        self.kv_tokens = 0
        self.first_token = None
        self.done_at = None
        self.prefill_worker = None
        self.decode_worker = None
        self.decode_only = False
        self.reused = 0


@dataclass
class StepOutcome:
    prefilled: list[SimRequest] = field(default_factory=list)  # first token now
    completed: list[SimRequest] = field(default_factory=list)
    stored: list[tuple[int | None, list[int]]] = field(default_factory=list)  # (parent, blocks)
    removed: list[int] = field(default_factory=list)
    # Calibration samples the worker would report: (new tokens, cached tokens, ms).
    prefill_samples: list[tuple[int, int, float]] = field(default_factory=list)
    decode_sample: tuple[int, float] | None = None  # (active blocks, ms per step)


class SimWorker:
    def __init__(self, worker_id: int, role: str, capacity_blocks: int, block_size: int,
                 timing: TimingModel) -> None:  # fmt: skip
        self.id = worker_id
        self.role = role
        self.block_size = block_size
        self.timing = timing
        self.cache = BlockCache(capacity_blocks)
        self.capacity_tokens = capacity_blocks * block_size
        self.waiting: deque[SimRequest] = deque()
        self.prefilling: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.busy = False
        self.event_seq = 0
        self.busy_ms = 0.0
        self._plan: tuple = ()
        self._evicted: list[int] = []
        self._received: list[tuple[int | None, list[int]]] = []

    def enqueue(self, request: SimRequest) -> None:
        # What the engine's prefix cache holds for it on arrival; admission
        # looks again.
        request.hit = self.cache.hit_length(request.blocks)
        self.waiting.append(request)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def queued_prefill_tokens(self) -> int:
        pending = sum(r.input_length - r.prefilled for r in self.prefilling)
        waiting = (r for r in self.waiting if not r.decode_only)
        return pending + sum(r.input_length - r.hit * self.block_size for r in waiting)

    def _admit(self) -> None:
        while self.waiting:
            r = self.waiting[0]
            hit = self.cache.hit_length(r.blocks)
            evicted = self.cache.admit(r.blocks, hit, r.private)
            if evicted is None:
                return
            self.waiting.popleft()
            self._evicted.extend(evicted)
            r.hit = hit
            if r.decode_only:
                # The blocks it lacked arrived from the prefill worker.
                if hit < len(r.blocks):
                    self._received.append((r.blocks[hit - 1] if hit else None, r.blocks[hit:]))
                r.kv_tokens = r.input_length + 1
                self.running.append(r)
            else:
                r.prefilled = r.reused = hit * self.block_size
                self.prefilling.append(r)

    def start_step(self, now: float, horizon: float) -> float | None:
        """Plans the next stretch of work starting at `now`; returns its end."""
        self._admit()
        t = self.timing
        budget = t.max_batched_tokens - len(self.running)
        chunks = []
        for r in self.prefilling:
            if budget <= 0:
                break
            c = min(budget, r.input_length - r.prefilled)
            chunks.append((r, c))
            budget -= c
        dt_step = t.decode_ms(sum(r.kv_tokens for r in self.running), self.capacity_tokens)
        if chunks:
            dt = t.prefill_ms(sum(c for _, c in chunks))
            if self.running:
                dt += dt_step
            steps = 1
        elif self.running:
            steps = min(r.remaining for r in self.running)
            if now < horizon < INF:
                steps = min(steps, max(1, math.ceil((horizon - now) / dt_step)))
            dt = steps * dt_step
        else:
            self.busy = False
            return None
        self.busy = True
        self.busy_ms += dt
        self._plan = (chunks, steps, dt, now)
        return now + dt

    def finish_step(self) -> StepOutcome:
        chunks, steps, dt, start = self._plan
        end = start + dt
        out = StepOutcome(removed=self._evicted, stored=self._received)
        self._evicted, self._received = [], []
        for r in self.running:
            r.remaining -= steps
            r.kv_tokens += steps
        if chunks:
            out.prefill_samples.append(
                (sum(c for _, c in chunks), sum(r.prefilled for r, _ in chunks), dt)
            )
        elif self.running:
            out.decode_sample = (self.cache.active, dt / steps)
        for r, c in chunks:
            r.prefilled += c
            if r.prefilled < r.input_length:
                continue
            self.prefilling.remove(r)
            r.first_token = end
            r.remaining = r.output_length - 1
            r.kv_tokens = r.input_length + 1
            out.prefilled.append(r)
            if r.hit < len(r.blocks):
                out.stored.append((r.blocks[r.hit - 1] if r.hit else None, r.blocks[r.hit :]))
            if self.role == "prefill":
                out.completed.append(r)
            else:
                self.running.append(r)
        finished = [r for r in self.running if r.remaining <= 0]
        if finished:
            self.running = [r for r in self.running if r.remaining > 0]
        for r in finished:
            r.done_at = end
            out.completed.append(r)
        for r in out.completed:
            self.cache.release(r.blocks, r.private)
        self.busy = False
        return out
