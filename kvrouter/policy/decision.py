"""What a routing decision returns, and how it explains itself."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kvrouter._core import NoWorkerAvailable

__all__ = ["CandidateCost", "Decision", "Explanation", "NoWorkerAvailable"]


@dataclass(frozen=True)
class CandidateCost:
    """One worker as the policy scored it for one request."""

    worker_id: int
    # Blocks of the prompt this worker already holds, by tier.
    overlap_device: int
    overlap_host: int
    overlap_disk: int
    # Predicted time to first token if chosen (ms), and its parts.
    queue_ms: float
    prefill_ms: float
    reload_ms: float
    decode_ms: float
    transfer_ms: float
    # Blocks the request would push out of a full cache, priced as prefill.
    overflow_ms: float
    active_requests: int
    # Skipped because it carried more than its share of the pool's requests.
    overloaded: bool

    @property
    def overlap(self) -> int:
        return self.overlap_device + self.overlap_host + self.overlap_disk

    @property
    def cost_ms(self) -> float:
        return (
            self.queue_ms
            + self.prefill_ms
            + self.reload_ms
            + self.decode_ms
            + self.transfer_ms
            + self.overflow_ms
        )

    def to_dict(self) -> dict:
        return {**asdict(self), "overlap": self.overlap, "cost_ms": self.cost_ms}


@dataclass
class Explanation:
    """The candidates with their overlaps and predicted costs, and why the
    winner won. In a split, decode candidates' costs include the prefill."""

    reason: str = ""
    decode_candidates: list[CandidateCost] = field(default_factory=list)
    prefill_candidates: list[CandidateCost] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "reason": self.reason,
            "decode_candidates": [c.to_dict() for c in self.decode_candidates],
            "prefill_candidates": [c.to_dict() for c in self.prefill_candidates],
        }


@dataclass
class Decision:
    """Where a request goes. `prefill_worker` is None when the decode worker
    prefills the prompt itself (aggregated worker, or local prefill)."""

    request_id: str
    prefill_worker: int | None
    decode_worker: int
    disaggregated: bool
    explanation: Explanation
    # Full blocks of the prompt, and the tokens the prefilling worker computes.
    num_blocks: int = 0
    prefill_tokens: int = 0
    predicted_ttft_ms: float = 0.0

    def to_dict(self) -> dict:
        return {
            "request_id": self.request_id,
            "prefill_worker": self.prefill_worker,
            "decode_worker": self.decode_worker,
            "disaggregated": self.disaggregated,
            "num_blocks": self.num_blocks,
            "prefill_tokens": self.prefill_tokens,
            "predicted_ttft_ms": self.predicted_ttft_ms,
            "explanation": self.explanation.to_dict(),
        }
