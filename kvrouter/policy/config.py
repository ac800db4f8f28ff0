"""Policy configuration: cost coefficients (starting values for online
calibration), selection, disaggregation thresholds and load-book settings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PolicyConfig:
    # -- cost model (ms); calibrated online from reported timings when enabled
    # Prefill time of n new tokens after p cached ones:
    #   prefill_ms_per_token * n + attention_ms_per_token2 * n * (p + n / 2)
    prefill_ms_per_token: float = 0.06
    attention_ms_per_token2: float = 1.0e-6
    # Each active decode block a worker holds slows every step it runs.
    decode_ms_per_block: float = 0.002
    # Bringing a matched block back from host memory or disk.
    host_reload_ms_per_block: float = 0.05
    disk_reload_ms_per_block: float = 0.5
    # Moving one block from a prefill worker to a decode worker.
    transfer_ms_per_block: float = 0.1
    calibrate: bool = True
    # Weight of a new timing sample in the running fit (0 < alpha <= 1).
    calibration_alpha: float = 0.05

    # -- selection
    # 0 picks the cheapest; > 0 samples with probability exp(-relative cost / temperature).
    temperature: float = 0.0
    # Costs within this fraction of the best count as a tie; ties go to the
    # worker with the fewest active requests, then round-robin.
    tie_tolerance: float = 0.02
    seed: int | None = None

    # -- disaggregation (used only when prefill-role workers exist)
    # Prefill on the decode worker when its cache leaves this few tokens to compute.
    local_prefill_max_tokens: int = 512
    # ... or when every prefill worker already has this much queued work.
    prefill_saturation_ms: float = 2000.0

    # -- load book
    # A routed request with no finish report for this long stops counting.
    stale_after_s: float = 600.0
    # Mark the routed prompt as cached on the chosen worker until its KV
    # events arrive; 0 disables.
    approximate_ttl_s: float = 0.0

    def validate(self) -> None:
        for name in (
            "prefill_ms_per_token",
            "attention_ms_per_token2",
            "decode_ms_per_block",
            "host_reload_ms_per_block",
            "disk_reload_ms_per_block",
            "transfer_ms_per_block",
            "temperature",
            "tie_tolerance",
            "prefill_saturation_ms",
            "approximate_ttl_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"PolicyConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not 0 < self.calibration_alpha <= 1:
            raise ValueError("PolicyConfig.calibration_alpha must be in (0, 1]")
        if self.stale_after_s <= 0:
            raise ValueError("PolicyConfig.stale_after_s must be > 0")
        if self.local_prefill_max_tokens < 0:
            raise ValueError("PolicyConfig.local_prefill_max_tokens must be >= 0")
