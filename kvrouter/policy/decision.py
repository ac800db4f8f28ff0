"""What a routing decision returns, and how it explains itself."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

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
    # The delay its extra prefill (over the best-cached candidate) passes on
    # to the requests queued behind it.
    congestion_ms: float
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
            + self.congestion_ms
        )

    def to_dict(self) -> dict:
        return {**asdict(self), "overlap": self.overlap, "cost_ms": self.cost_ms}

    @classmethod
    def from_row(cls, row: tuple) -> CandidateCost:
        """From the core's `CandidateRow`."""
        worker, device, host, disk, costs, active, overloaded = row
        return cls(worker, device, host, disk, *costs, active, overloaded)


class Explanation:
    """The candidates with their overlaps and predicted costs, and why the
    winner won. In a split, decode candidates' costs include the prefill.

    Built from the core's raw rows, the candidate objects are made on first
    access: most decisions are never explained, and making them costs more
    than the decision itself."""

    def __init__(
        self,
        reason: str = "",
        decode_candidates: Sequence[CandidateCost] = (),
        prefill_candidates: Sequence[CandidateCost] = (),
    ) -> None:
        self.reason = reason
        self._decode: Sequence = decode_candidates
        self._prefill: Sequence = prefill_candidates
        self._raw = False

    @classmethod
    def from_rows(cls, reason: str, decode_rows: Sequence, prefill_rows: Sequence) -> Explanation:
        explanation = cls(reason, decode_rows, prefill_rows)
        explanation._raw = True
        return explanation

    @property
    def decode_candidates(self) -> list[CandidateCost]:
        self._build()
        return list(self._decode)

    @property
    def prefill_candidates(self) -> list[CandidateCost]:
        self._build()
        return list(self._prefill)

    def decode_candidate(self, worker_id: int | None) -> CandidateCost | None:
        """The decode-side candidate for one worker, without building the rest."""
        return self._find(self._decode, worker_id)

    def prefill_candidate(self, worker_id: int | None) -> CandidateCost | None:
        return self._find(self._prefill, worker_id)

    def _find(self, candidates: Sequence, worker_id: int | None) -> CandidateCost | None:
        for candidate in candidates:
            if candidate[0] == worker_id if self._raw else candidate.worker_id == worker_id:
                return CandidateCost.from_row(candidate) if self._raw else candidate
        return None

    def _build(self) -> None:
        if self._raw:
            self._decode = [CandidateCost.from_row(row) for row in self._decode]
            self._prefill = [CandidateCost.from_row(row) for row in self._prefill]
            self._raw = False

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
