"""What a routing decision returns, and how it explains itself."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


class NoWorkerAvailable(RuntimeError):
    """No healthy worker can take the request (none registered, all unhealthy,
    or none with enough KV capacity for the prompt)."""


@dataclass(frozen=True)
class CandidateCost:
    """One worker as the policy saw it for one request."""

    worker_id: int
    role: str
    # Blocks of the prompt this worker already holds, by tier.
    overlap_device: int
    overlap_host: int
    overlap_disk: int
    # Predicted time to first token if chosen, in ms, and its parts.
    cost_ms: float
    queue_ms: float
    prefill_ms: float
    reload_ms: float
    decode_ms: float
    transfer_ms: float = 0.0

    @property
    def overlap(self) -> int:
        return self.overlap_device + self.overlap_host + self.overlap_disk


@dataclass
class Decision:
    """Where a request goes. `prefill_worker` is None when the decode worker
    prefills the prompt itself (aggregated worker or local prefill)."""

    request_id: str
    decode_worker: int
    prefill_worker: int | None = None
    disaggregated: bool = False
    # Blocks of the prompt (full blocks only) and their sequence hashes.
    num_blocks: int = 0
    predicted_ttft_ms: float = 0.0
    explanation: Explanation = field(default_factory=lambda: Explanation())

    def to_dict(self) -> dict:
        return {
            "request_id": self.request_id,
            "prefill_worker": self.prefill_worker,
            "decode_worker": self.decode_worker,
            "disaggregated": self.disaggregated,
            "num_blocks": self.num_blocks,
            "predicted_ttft_ms": self.predicted_ttft_ms,
            "explanation": self.explanation.to_dict(),
        }


@dataclass
class Explanation:
    """The candidates with their overlaps and predicted costs, and why the
    winner won."""

    reason: str = ""
    decode_candidates: list[CandidateCost] = field(default_factory=list)
    prefill_candidates: list[CandidateCost] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "reason": self.reason,
            "decode_candidates": [_candidate_dict(c) for c in self.decode_candidates],
            "prefill_candidates": [_candidate_dict(c) for c in self.prefill_candidates],
        }


def _candidate_dict(candidate: CandidateCost) -> dict:
    out = asdict(candidate)
    out["overlap"] = candidate.overlap
    return out
