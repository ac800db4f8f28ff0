"""Policy configuration: cost coefficients (starting values for online
calibration), selection, disaggregation thresholds and load-book settings.

The coefficient defaults describe an H100-class engine serving an 8B model
with chunked prefill; docs/routing.md shows how they were measured."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class PolicyConfig:
    # -- cost model (ms); calibrated online from reported timings when enabled
    # Prefill of n new tokens after p cached ones takes
    #   prefill_base_ms + prefill_ms_per_token * n + attention_ms_per_token2 * n * (p + n / 2)
    prefill_base_ms: float = 12.0
    prefill_ms_per_token: float = 0.02
    attention_ms_per_token2: float = 1.06e-8
    # Each engine iteration also reads the KV blocks of the running decodes.
    decode_ms_per_block: float = 0.0032
    # Bringing a matched block back to the device from host memory or disk.
    host_reload_ms_per_block: float = 0.05
    disk_reload_ms_per_block: float = 0.5
    # Moving one block from a prefill worker to a decode worker.
    transfer_ms_per_block: float = 0.1
    # Prefill tokens per engine iteration (chunk size).
    max_batched_tokens: int = 8192
    calibrate: bool = True
    # Weight of a new timing sample in the running fit (0 < alpha <= 1).
    calibration_alpha: float = 0.05

    # -- selection
    # 0 picks the cheapest; > 0 samples with weight exp(-(cost - best) / (temperature * best)).
    temperature: float = 0.0
    # Costs within this fraction of the best tie; ties go to the worker with
    # the fewest active requests, then in turn.
    tie_tolerance: float = 0.02
    # Skip a worker holding more than this many times the pool's mean active
    # requests (plus one) while another worker is not; 0 disables.
    overload_factor: float = 4.0
    # Weight of the delay a placement's wasted prefill (over the best-cached
    # worker) passes on to the requests queued behind it; 0 prices only the
    # request's own TTFT. See docs/routing.md.
    congestion_weight: float = 1.0
    seed: int = 0

    # -- disaggregation (used only when prefill-role workers exist)
    # Prefill on the decode worker when its cache leaves this few tokens to compute...
    local_prefill_max_tokens: int = 16384
    # ... or when the least-queued prefill worker has this much queued work (ms).
    # Both defaults were chosen by replay (bench/replay_pd_sweep.py).
    prefill_saturation_ms: float = 1000.0

    # -- load book
    # A routed request with no finish report for this long stops counting.
    stale_after_s: float = 600.0
    # When the prefilling worker last reported a backlog, mark the routed
    # prompt as cached on the chosen worker(s) until its KV events arrive,
    # for at most this long; 0 disables. Without it, a session's next turn
    # that arrives while the last one still waits for prefill sees no cache
    # anywhere and may land elsewhere.
    approximate_ttl_s: float = 30.0

    def validate(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
                raise ValueError(f"PolicyConfig.{name} must be >= 0, got {value}")
        if not 0 < self.calibration_alpha <= 1:
            raise ValueError("PolicyConfig.calibration_alpha must be in (0, 1]")
        if self.stale_after_s <= 0:
            raise ValueError("PolicyConfig.stale_after_s must be > 0")
        if self.max_batched_tokens <= 0:
            raise ValueError("PolicyConfig.max_batched_tokens must be > 0")

    def core_kwargs(self) -> dict:
        """Arguments for kvrouter._core.RoutingCore."""
        fields = asdict(self)
        del fields["approximate_ttl_s"]
        fields["max_batched_tokens"] = float(self.max_batched_tokens)
        return fields
