"""Continuous batching with chunked prefill and preemption.

Each step builds one batch under a token budget. Running sequences go
first, in arrival order: a decoding sequence takes one token, a sequence in
the middle of its prompt takes the next chunk. Waiting sequences are then
admitted while budget, sequence slots and KV blocks last; with chunked
prefill a long prompt takes whatever budget is left, so decodes never wait
behind a whole prompt.

When a running sequence needs a block and none is free, the most recently
admitted running sequence is preempted: its blocks are freed and it goes
back to the head of the queue to be recomputed (its blocks usually stay in
the prefix cache, so recomputing is mostly cache hits).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from kvrouter.engine.block_manager import BlockManager
from kvrouter.engine.sampler import NO_TOKEN
from kvrouter.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSequence:
    seq: Sequence
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """Whether this chunk reaches the last token, whose logits pick the next one."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool,
        eos_token_ids: tuple[int, ...],
    ) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.eos_token_ids = eos_token_ids
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
            self.block_manager.free(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._finish(seq, "abort")

    def schedule(self) -> list[ScheduledSequence]:
        budget = self.max_num_batched_tokens
        batch: list[ScheduledSequence] = []
        preempted = self._schedule_running(batch, budget)
        budget -= sum(item.num_new_tokens for item in batch)
        if not preempted:
            self._admit_waiting(batch, budget)
        return batch

    def _schedule_running(self, batch: list[ScheduledSequence], budget: int) -> bool:
        manager = self.block_manager
        preempted = False
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            target = seq.num_computed_tokens + num_new
            while manager.blocks_needed(seq, target) > manager.num_free_blocks:
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING:
                break
            manager.grow(seq, target)
            batch.append(ScheduledSequence(seq, num_new))
            budget -= num_new
            index += 1
        return preempted

    def _admit_waiting(self, batch: list[ScheduledSequence], budget: int) -> None:
        manager = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hits = manager.prefix_hits(seq)
            remaining = seq.num_tokens - len(hits) * manager.block_size
            if self.enable_chunked_prefill:
                num_new = min(remaining, budget)
            elif remaining <= budget or not batch:
                # Unchunked, a prompt longer than the budget still runs, alone.
                num_new = remaining
            else:
                break
            if not manager.can_admit(hits, len(hits) * manager.block_size + num_new):
                break
            self.waiting.popleft()
            manager.admit(seq, hits)
            manager.grow(seq, seq.num_computed_tokens + num_new)
            if seq.timings.first_scheduled is None:
                seq.timings.first_scheduled = time.monotonic()
                seq.num_cached_tokens = seq.num_computed_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.append(ScheduledSequence(seq, num_new))
            budget -= num_new

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def postprocess(self, batch: list[ScheduledSequence], sampled: list[int]) -> list[Sequence]:
        """Records a step's progress; `sampled` holds one token per sampling
        entry of `batch`, in order (NO_TOKEN ends that sequence alone, with
        reason "error"). Returns the sequences that finished."""
        now = time.monotonic()
        tokens = iter(sampled)
        finished = []
        for item in batch:
            seq = item.seq
            samples = item.samples
            seq.num_computed_tokens += item.num_new_tokens
            self.block_manager.commit(seq)
            if not samples:
                continue
            token = next(tokens)
            if token == NO_TOKEN:
                self._end(seq, "error")
                finished.append(seq)
                continue
            seq.token_ids.append(token)
            if seq.timings.first_token is None:
                seq.timings.first_token = now
            seq.timings.token_times.append(now)
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self._end(seq, reason)
                finished.append(seq)
        return finished

    def _end(self, seq: Sequence, reason: str) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        self._finish(seq, reason)

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.params
        if token in params.stop_token_ids:
            return "stop"
        if not params.ignore_eos and token in self.eos_token_ids:
            return "stop"
        if seq.num_output_tokens >= params.max_tokens:
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.timings.finished = time.monotonic()
