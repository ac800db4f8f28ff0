"""The round-robin baseline: prefill and decode workers taken in turn,
every request split when prefill workers exist. It has the policy's routing
interface, so the proxy can run either on the same workload."""

from __future__ import annotations

import itertools

from kvrouter.policy import Decision, NoWorkerAvailable
from kvrouter.policy.decision import CandidateCost, Explanation
from kvrouter.service.workers import WorkerTable


def _candidate(worker_id: int) -> CandidateCost:
    return CandidateCost(worker_id, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, False)


class RoundRobinRouter:
    def __init__(self, workers: WorkerTable, block_size: int) -> None:
        self.workers = workers
        self.block_size = block_size
        self._turn = itertools.count()

    def route(self, request_id: str, tokens, namespace: str = "") -> Decision:
        records = sorted(
            (r for r in self.workers.records() if not r.stale), key=lambda r: r.worker_id
        )
        decode = [r.worker_id for r in records if r.role in ("decode", "both")]
        prefill = [r.worker_id for r in records if r.role == "prefill"]
        if not decode:
            raise NoWorkerAvailable("no healthy decode worker is registered")
        turn = next(self._turn)
        # Rotate so the chosen worker comes first and retries take the next in turn.
        decode = decode[turn % len(decode) :] + decode[: turn % len(decode)]
        prefill = prefill[turn % len(prefill) :] + prefill[: turn % len(prefill)] if prefill else []
        num_tokens = len(tokens) // 4 if isinstance(tokens, bytes | bytearray) else len(tokens)
        return Decision(
            request_id=request_id,
            prefill_worker=prefill[0] if prefill else None,
            decode_worker=decode[0],
            disaggregated=bool(prefill),
            explanation=Explanation(
                "round robin",
                [_candidate(w) for w in decode],
                [_candidate(w) for w in prefill],
            ),
            num_blocks=num_tokens // self.block_size,
            prefill_tokens=num_tokens,
        )

    def prefill_done(self, request_id: str) -> None:
        pass

    def finished(self, request_id: str) -> None:
        pass

    def cancelled(self, request_id: str) -> None:
        pass

    def report_prefill_timing(
        self, new_tokens: int, cached_tokens: int, duration_ms: float
    ) -> None:
        pass

    def report_transfer(self, blocks: int, duration_ms: float) -> None:
        pass
