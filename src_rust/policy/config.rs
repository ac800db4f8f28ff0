//! The policy's settings, with their defaults: the one place they are
//! written. The Python `PolicyConfig` is this struct (src_rust/python/config.rs).

use super::cost::Coefficients;
use super::select::Selector;

/// Which routing policy decides. `Kvrouter` is the cost model; the others
/// are the baselines it is measured against, on the same load book.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PolicyName {
    Kvrouter,
    RoundRobin,
    Random,
    LeastLoaded,
    OverlapOnly,
    Dynamo,
}

impl PolicyName {
    pub const ALL: [PolicyName; 6] = [
        PolicyName::Kvrouter,
        PolicyName::RoundRobin,
        PolicyName::Random,
        PolicyName::LeastLoaded,
        PolicyName::OverlapOnly,
        PolicyName::Dynamo,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyName::Kvrouter => "kvrouter",
            PolicyName::RoundRobin => "round_robin",
            PolicyName::Random => "random",
            PolicyName::LeastLoaded => "least_loaded",
            PolicyName::OverlapOnly => "overlap_only",
            PolicyName::Dynamo => "dynamo",
        }
    }

    pub fn parse(name: &str) -> Result<PolicyName, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|p| p.name()).collect();
                format!("unknown policy {name:?}; choose from {}", names.join(", "))
            })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct PolicyConfig {
    pub policy: PolicyName,
    /// Starting values; calibrated online from reported timings when `calibrate`.
    pub coefficients: Coefficients,
    pub selector: Selector,
    pub calibrate: bool,
    /// Weight of a new timing sample in the running fit (0 < alpha <= 1).
    pub calibration_alpha: f64,
    pub seed: u64,
    /// Prefill on the decode worker when its cache leaves at most this many
    /// tokens to compute...
    pub local_prefill_max_tokens: u64,
    /// ...or when the least-queued prefill worker has this much queued (ms).
    /// Both defaults were chosen by replay (bench/replay_pd_sweep.py).
    pub prefill_saturation_ms: f64,
    /// A routed request with no finish report for this long stops counting.
    pub stale_after_ms: u64,
    /// A booking its worker's load report has not counted for this long
    /// after it was routed (and should have reached the worker) stops
    /// counting at that report: its finish was lost. 0 disables.
    pub unreported_grace_ms: u64,
    /// Scales `Cost::congestion_ms`; 0 prices each request's own TTFT only.
    pub congestion_weight: f64,
    /// Scales `Cost::pollution_ms`, what a request's new blocks cost the
    /// later requests that would have hit the blocks they evict; 0 (the
    /// default: see docs/routing.md, "Cache pollution") leaves it out.
    pub pollution_weight: f64,
    /// Scales `Cost::tail_ms`, the price of a queue wait that leaves a
    /// request's first token far behind the typical one; 0 leaves it out
    /// (docs/routing.md, "The cost: the whole request").
    pub tail_weight: f64,
    /// When the prefilling worker last reported a backlog, the routed prompt
    /// counts as cached on the chosen worker(s) until its KV events arrive,
    /// for at most this long; 0 disables. Without it, a session's next turn
    /// that arrives while the last one still waits for prefill sees no cache
    /// anywhere and may land elsewhere.
    pub approximate_ttl_ms: u64,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            policy: PolicyName::Kvrouter,
            coefficients: Coefficients::default(),
            selector: Selector {
                temperature: 0.0,
                tie_tolerance: 0.02,
                overload_factor: 4.0,
            },
            calibrate: true,
            calibration_alpha: 0.05,
            seed: 0,
            local_prefill_max_tokens: 16_384,
            prefill_saturation_ms: 1000.0,
            stale_after_ms: 600_000,
            unreported_grace_ms: 30_000,
            congestion_weight: 1.0,
            pollution_weight: 0.0,
            tail_weight: 1.0,
            approximate_ttl_ms: 30_000,
        }
    }
}

impl PolicyConfig {
    /// Err names the first setting out of range.
    pub fn validate(&self) -> Result<(), String> {
        let c = &self.coefficients;
        let s = &self.selector;
        let non_negative = [
            ("prefill_base_ms", c.prefill_base_ms),
            ("prefill_ms_per_token", c.prefill_ms_per_token),
            ("attention_ms_per_token2", c.attention_ms_per_token2),
            ("decode_ms_per_block", c.decode_ms_per_block),
            ("host_reload_ms_per_block", c.host_reload_ms_per_block),
            ("disk_reload_ms_per_block", c.disk_reload_ms_per_block),
            ("transfer_ms_per_block", c.transfer_ms_per_block),
            ("temperature", s.temperature),
            ("tie_tolerance", s.tie_tolerance),
            ("overload_factor", s.overload_factor),
            ("prefill_saturation_ms", self.prefill_saturation_ms),
            ("congestion_weight", self.congestion_weight),
            ("pollution_weight", self.pollution_weight),
            ("tail_weight", self.tail_weight),
        ];
        for (name, value) in non_negative {
            if !(value >= 0.0 && value.is_finite()) {
                return Err(format!(
                    "PolicyConfig.{name} must be a finite number >= 0, got {value}"
                ));
            }
        }
        if !(self.calibration_alpha > 0.0 && self.calibration_alpha <= 1.0) {
            return Err(format!(
                "PolicyConfig.calibration_alpha must be in (0, 1], got {}",
                self.calibration_alpha
            ));
        }
        if self.stale_after_ms == 0 {
            return Err("PolicyConfig.stale_after_s must be > 0".into());
        }
        if c.max_batched_tokens.is_nan() || c.max_batched_tokens < 1.0 {
            return Err("PolicyConfig.max_batched_tokens must be > 0".into());
        }
        Ok(())
    }
}
