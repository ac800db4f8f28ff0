"""A simulated engine: a KV cache plus the batching loop of timing.py, with
vLLM's scheduling as Dynamo's mocker runs it.

The simulator calls `start_step(now, horizon)` on an idle worker, which plans
the next stretch of work and returns when it ends, then `finish_step()` at
that time. A stretch is one iteration when it carries prefill, or a run of
pure-decode iterations that stops at the first completion, at the first
iteration end past `horizon` (the next arrival), or before the iteration
that would find the cache full, so requests join and leave exactly at
iteration boundaries without simulating every decode step.

Each iteration serves the running requests in the order they were admitted,
one token for a decode and a chunk for a prefill, while the token budget
lasts, then admits waiting requests first come, first served. A request is
admitted when the blocks of everything it knows (prompt, plus the tokens it
generated before a preemption) fit; its output blocks are allocated one at a
time as decode reaches them. When a decode finds no free block, the request
admitted last is preempted: its blocks are released (its prompt stays
cached until evicted), it goes back to the head of the queue, and no request
is admitted in that iteration. Readmitted, it recomputes its prompt (less
what is still cached) and the tokens it had generated, then decodes on."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvrouter.replay.cache import BlockCache
from kvrouter.replay.timing import TimingModel
from kvrouter.replay.trace import reusable_blocks

INF = float("inf")


class SimRequest:
    __slots__ = (
        "id", "arrival", "input_length", "output_length", "blocks", "hashes",
        "hit", "computed", "held", "remaining", "kv_tokens", "first_token",
        "done_at", "prefill_worker", "decode_worker", "decode_only", "reused",
        "published",
    )  # fmt: skip

    def __init__(self, rid, arrival, input_length, output_length, blocks):
        self.id = rid
        self.arrival = arrival
        self.input_length = input_length
        self.output_length = output_length
        self.blocks = blocks
        self.hashes = None
        self.hit = 0
        self.computed = 0  # tokens whose KV is in the cache, cached prefix included
        self.held = 0  # unshared blocks it holds: the prompt's tail, its output
        self.remaining = output_length
        self.kv_tokens = 0  # context the next decode step reads
        self.first_token = None
        self.done_at = None
        self.prefill_worker = None
        self.decode_worker = None
        self.decode_only = False
        self.reused = 0
        self.published = 0  # prompt blocks its worker has published as stored

    def outcome(self) -> tuple[float, float, int]:
        """Once finished: its TTFT and end-to-end latency (ms) and the prompt
        tokens it reused."""
        return self.first_token - self.arrival, self.done_at - self.arrival, self.reused

    def known_tokens(self) -> int:
        """Prompt plus the tokens generated so far."""
        return self.input_length + self.output_length - self.remaining

    def prefill_left(self) -> int:
        """Tokens to compute before its next token, or 0 when it decodes
        (then only the token it last sampled is left)."""
        todo = self.known_tokens() - self.computed
        return todo if self.computed < self.input_length or todo > 1 else 0


@dataclass
class StepOutcome:
    prefilled: list[SimRequest] = field(default_factory=list)  # first token now
    completed: list[SimRequest] = field(default_factory=list)
    stored: list[tuple[int | None, list[int]]] = field(default_factory=list)  # (parent, blocks)
    removed: list[int] = field(default_factory=list)
    # Calibration samples the worker would report: (new tokens, cached tokens, ms).
    prefill_samples: list[tuple[int, int, float]] = field(default_factory=list)
    # (KV blocks a decode step reads, a shared prefix once per request; ms per step)
    decode_sample: tuple[int, float] | None = None


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
        self.running: list[SimRequest] = []  # admitted, in admission order
        self.busy = False
        self.event_seq = 0
        self.busy_ms = 0.0
        self._plan: tuple = ()
        self._evicted: list[int] = []
        self._received: list[tuple[int | None, list[int]]] = []

    def enqueue(self, request: SimRequest) -> None:
        # What the engine's prefix cache holds for it on arrival; admission
        # looks again.
        request.hit = self._hit(request)
        self.waiting.append(request)

    def _hit(self, r: SimRequest) -> int:
        """Blocks of `r`'s prompt its prefix cache lets it skip."""
        most = reusable_blocks(r.known_tokens(), self.block_size)
        return min(self.cache.hit_length(r.blocks), most)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def queued_prefill_tokens(self) -> int:
        pending = sum(r.prefill_left() for r in self.running)
        waiting = (r for r in self.waiting if not r.decode_only)
        return pending + sum(r.input_length - r.hit * self.block_size for r in waiting)

    def _blocks_short(self, r: SimRequest, tokens: int) -> int:
        """Blocks `r` lacks to hold `tokens` of context."""
        return max(-(-tokens // self.block_size) - len(r.blocks) - r.held, 0)

    def _grow(self, r: SimRequest, tokens: int) -> bool:
        need = self._blocks_short(r, tokens)
        if not need:
            return True
        evicted = self.cache.grow(need)
        if evicted is None:
            return False
        self._evicted.extend(evicted)
        r.held += need
        return True

    def _release(self, r: SimRequest) -> None:
        full = min(r.computed // self.block_size - len(r.blocks), r.held)
        self.cache.release(r.blocks, r.held, max(full, 0))
        r.held = 0

    def _preempt_last(self) -> SimRequest:
        victim = self.running.pop()
        self._release(victim)
        victim.computed = 0
        victim.decode_only = False  # it recomputes here what it lost
        self.waiting.appendleft(victim)
        return victim

    def _admit(self, budget: int, chunks: list, decoders: list) -> None:
        """Admits waiting requests while the budget lasts and they fit."""
        bs = self.block_size
        while self.waiting and budget > 0:
            r = self.waiting[0]
            # A decode-only request computes nothing of its prompt here.
            hit = self.cache.hit_length(r.blocks) if r.decode_only else self._hit(r)
            known = r.known_tokens()
            tail = max(-(-known // bs) - len(r.blocks), 0)
            evicted = self.cache.admit(r.blocks, hit, tail)
            if evicted is None:
                return
            self.waiting.popleft()
            self._evicted.extend(evicted)
            r.hit, r.held = hit, tail
            r.published = hit
            self.running.append(r)
            if r.decode_only:
                # The blocks it lacked arrived from the prefill worker, with
                # the first token still to run through the model.
                if hit < len(r.blocks):
                    self._received.append((r.blocks[hit - 1] if hit else None, r.blocks[hit:]))
                r.kv_tokens = known
                r.computed = known - 1
                decoders.append(r)
                budget -= 1
                continue
            r.computed = hit * bs
            if r.first_token is None:
                r.reused = r.computed
            c = min(budget, known - r.computed)
            chunks.append((r, c))
            budget -= c

    def start_step(self, now: float, horizon: float) -> float | None:
        """Plans the next stretch of work starting at `now`; returns its end."""
        t = self.timing
        budget = t.max_batched_tokens
        chunks: list[tuple[SimRequest, int]] = []
        decoders: list[SimRequest] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            left = r.prefill_left()
            if left:
                c = min(budget, left)
                chunks.append((r, c))
                budget -= c
            elif self._grow(r, r.kv_tokens):
                decoders.append(r)
                budget -= 1
            else:
                preempted = True
                if self._preempt_last() is not r:
                    continue
                break
            i += 1
        if not preempted:
            self._admit(budget, chunks, decoders)
        if chunks:
            spans = self._prompt_spans(chunks)
            prompts = [(start, end) for start, end in spans if end > start]
            # As in the mocker, a chunk that recomputes only what a preempted
            # request had generated costs no prefill time: it is priced as a
            # decode reading its context.
            kv = sum(r.kv_tokens for r in decoders) + sum(
                r.computed + c
                for (r, c), (start, end) in zip(chunks, spans, strict=True)
                if end == start
            )
            dt = t.batch_prefill_ms(prompts) if prompts else 0.0
            if kv:
                dt += t.decode_ms(kv, self.capacity_tokens)
            steps = 1
        elif decoders:
            kv = sum(r.kv_tokens for r in decoders)

            def run_ms(n: int) -> float:
                return t.decode_run_ms(kv, len(decoders), n, self.capacity_tokens)

            steps = self._decode_steps_that_fit(decoders, min(r.remaining for r in decoders))
            if now < horizon < INF:
                steps = _fewest(steps, lambda n: run_ms(n) >= horizon - now)
            for r in decoders:
                self._grow(r, r.kv_tokens + steps - 1)
            dt = run_ms(steps)
        else:
            self.busy = False
            return None
        self.busy = True
        self.busy_ms += dt
        self._plan = (chunks, decoders, steps, dt, now)
        return now + dt

    @staticmethod
    def _prompt_spans(chunks: list[tuple[SimRequest, int]]) -> list[tuple[int, int]]:
        """The prompt positions each chunk computes: the generated tokens a
        preempted request recomputes take budget but, as in the mocker, no
        prefill time."""
        return [
            (min(r.computed, r.input_length), min(r.computed + c, r.input_length))
            for r, c in chunks
        ]

    def _decode_steps_that_fit(self, decoders: list[SimRequest], steps: int) -> int:
        """How many of `steps` decode iterations (the first one's blocks
        already held) run before one finds the cache full."""
        room = self.cache.capacity - self.cache.active

        def too_many(n: int) -> bool:
            return sum(self._blocks_short(r, r.kv_tokens + n - 1) for r in decoders) > room

        return _fewest(steps + 1, too_many) - 1

    def finish_step(self) -> StepOutcome:
        chunks, decoders, steps, dt, start = self._plan
        end = start + dt
        out = StepOutcome(removed=self._evicted, stored=self._received)
        self._evicted, self._received = [], []
        for r in decoders:
            r.computed += steps
            r.remaining -= steps
            r.kv_tokens += steps
        if chunks:
            new = sum(end - start for start, end in self._prompt_spans(chunks))
            out.prefill_samples.append((new, sum(r.computed for r, _ in chunks), dt))
        elif decoders:
            read = sum(r.kv_tokens for r in decoders)
            out.decode_sample = (-(-read // self.block_size), dt / steps)
        for r, c in chunks:
            r.computed += c
            # As in Dynamo's mocker, a router sees a chunk's blocks once the
            # iteration that computed them has ended, chunk by chunk.
            full = min(r.computed // self.block_size, len(r.blocks))
            if full > r.published:
                parent = r.blocks[r.published - 1] if r.published else None
                out.stored.append((parent, r.blocks[r.published : full]))
                r.published = full
            if r.computed < r.known_tokens():
                continue
            # The prompt (or what a preemption lost) is in: this iteration
            # samples the next token, whose KV the next decode step computes.
            r.remaining -= 1
            r.kv_tokens = r.known_tokens()
            if r.first_token is None:
                r.first_token = end
                out.prefilled.append(r)
            if self.role == "prefill":
                out.completed.append(r)
        gone = {id(r) for r in out.completed}
        for r in self.running:
            if r.remaining <= 0 and id(r) not in gone:
                r.done_at = end
                out.completed.append(r)
                gone.add(id(r))
        if gone:
            self.running = [r for r in self.running if id(r) not in gone]
        for r in out.completed:
            self._release(r)
        self.busy = False
        return out


def _fewest(most: int, enough) -> int:
    """The least n in 1..`most` for which `enough(n)` holds (monotone in n),
    or `most` when none does."""
    lo, hi = 1, most
    while lo < hi:
        mid = (lo + hi) // 2
        if enough(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo
