//! The routing policy: the pool of workers with its load book, and the
//! `RoutingPolicy` plug point that picks workers from it. kvrouter's own
//! policy scores every candidate by predicted time to first token and picks
//! one fairly (kv_cost.rs); the baselines are policies too (baselines.rs).
//! Design notes: README.md.

mod active_blocks;
mod baselines;
mod book;
mod calibrate;
mod config;
mod cost;
mod kv_cost;
mod lifetime;
mod models;
mod pool;
mod select;
mod sessions;

pub use baselines::Baseline;
pub use book::{Booked, Booking, LoadBook};
pub use calibrate::Calibrator;
pub use config::{PolicyConfig, PolicyName};
pub use cost::{Coefficients, Cost, Load, Request};
pub use kv_cost::CostPolicy;
pub use lifetime::Lifetime;
pub use models::{ModelId, Serves, ADAPTER_SEPARATOR};
pub use pool::{Pool, WorkerState};
pub use select::{Candidate, Pick, Rng, Selector};
pub use sessions::{Affinity, SessionKey, MAX_SESSIONS};

use crate::ids::WorkerId;
use crate::index::TierDepths;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Role {
    Prefill,
    Decode,
    Both,
}

impl Role {
    pub fn parse(name: &str) -> Option<Role> {
        match name {
            "prefill" => Some(Role::Prefill),
            "decode" => Some(Role::Decode),
            "both" => Some(Role::Both),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Both => "both",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub decode_worker: WorkerId,
    /// None: the decode worker prefills itself.
    pub prefill_worker: Option<WorkerId>,
    pub predicted_ttft_ms: f64,
    /// Tokens the prefilling worker computes (the request's uncached part there).
    pub prefill_tokens: u64,
    pub reason: String,
    /// The session's last worker won a tie (on either side).
    pub by_affinity: bool,
    /// Decode-side candidates; in a split their cost includes the chosen prefill.
    pub decode_candidates: Vec<Candidate>,
    pub prefill_candidates: Vec<Candidate>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("request {0:?} is already routed")]
    DuplicateRequest(String),
    #[error("no healthy decode-capable worker with room for {blocks} blocks ({registered} workers of the model registered)")]
    NoWorker { blocks: u64, registered: usize },
    #[error("model {0:?} is not served here: no registered worker serves it")]
    UnknownModel(String),
    #[error(
        "model {name:?} is an adapter of several models ({models}): name one as model:adapter"
    )]
    AmbiguousAdapter { name: String, models: String },
    #[error("unknown worker {0}")]
    UnknownWorker(u64),
}

/// The index's matches for a request's blocks: per worker, by tier.
pub type Overlaps<'a> = &'a [(WorkerId, TierDepths)];

/// A timing a worker measured, for a policy that calibrates its model.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Timing {
    Prefill {
        new_tokens: f64,
        cached_tokens: f64,
        ms: f64,
    },
    DecodeStep {
        active_blocks: f64,
        ms: f64,
    },
    Transfer {
        blocks: f64,
        ms: f64,
    },
}

/// The plug point: how workers are chosen for a request.
///
/// Contract: `decide` picks a healthy decode-capable worker of the
/// request's model with room for the prompt (`Pool::eligible`; and, when
/// the model has prefill workers, may split off the prefill to one of
/// them), or returns `RouteError::NoWorker`.
/// It books nothing: `Policy::route` charges the decision to the pool's
/// book. Candidates are listed in the order the policy would fall back to
/// them among equal costs.
pub trait RoutingPolicy: Send {
    fn decide(
        &mut self,
        pool: &Pool,
        request: &Request,
        overlaps: Overlaps<'_>,
    ) -> Result<Decision, RouteError>;

    /// Takes a timing a worker reported; policies without a model ignore it.
    fn observe(&mut self, _timing: Timing) {}

    /// The cost model in use, for policies that have one.
    fn coefficients(&self) -> Option<Coefficients> {
        None
    }

    /// False when the policy never looks at overlaps, so the index lookup
    /// can be skipped.
    fn uses_index(&self) -> bool {
        true
    }

    /// True when the policy reads `Pool::distinct_active_blocks`: only
    /// then do bookings keep the prompt's block hashes.
    fn counts_distinct_blocks(&self) -> bool {
        false
    }
}

/// The policy `config.policy` names.
pub fn make_policy(config: &PolicyConfig) -> Box<dyn RoutingPolicy> {
    match config.policy {
        PolicyName::Kvrouter => Box::new(CostPolicy::new(config)),
        other => Box::new(Baseline::new(other, config)),
    }
}

/// A pool and the policy that routes over it: decide, then book.
pub struct Policy {
    pub config: PolicyConfig,
    pub pool: Pool,
    chooser: Box<dyn RoutingPolicy>,
}

impl Policy {
    pub fn new(config: PolicyConfig) -> Self {
        Policy {
            chooser: make_policy(&config),
            config,
            pool: Pool::default(),
        }
    }

    pub fn uses_index(&self) -> bool {
        self.chooser.uses_index()
    }

    pub fn observe(&mut self, timing: Timing) {
        if let Timing::DecodeStep { ms, .. } = timing {
            self.pool.lifetime.step(ms);
        }
        self.chooser.observe(timing);
    }

    /// The cost coefficients in use (after calibration).
    pub fn coefficients(&self) -> Coefficients {
        self.chooser
            .coefficients()
            .unwrap_or(self.config.coefficients)
    }

    /// Takes a worker's load report and retires the bookings it no longer
    /// accounts for (see `LoadBook::retire_unreported`); returns their ids.
    pub fn report_load(
        &mut self,
        worker: WorkerId,
        load: Load,
        now_ms: u64,
    ) -> Result<Vec<String>, RouteError> {
        self.pool.report_load(worker, load)?;
        self.pool.lifetime.tick(now_ms);
        if self.config.unreported_grace_ms == 0 {
            return Ok(Vec::new());
        }
        let horizon = now_ms.saturating_sub(self.config.unreported_grace_ms);
        Ok(self
            .pool
            .book
            .retire_unreported(worker, load.active_requests, horizon))
    }

    /// Picks the prefill and decode workers and books the request on them,
    /// and remembers them for its session. `overlaps` are the index's
    /// matches for the request's blocks.
    pub fn route(
        &mut self,
        request_id: &str,
        request: Request<'_>,
        overlaps: Overlaps<'_>,
        now_ms: u64,
    ) -> Result<Decision, RouteError> {
        self.pool
            .book
            .expire(now_ms.saturating_sub(self.config.stale_after_ms));
        if self.pool.book.contains(request_id) {
            return Err(RouteError::DuplicateRequest(request_id.to_string()));
        }
        self.pool.lifetime.tick(now_ms);
        let decision = self.chooser.decide(&self.pool, &request, overlaps)?;
        self.pool.charge(
            request_id.to_string(),
            Booking {
                prefill_worker: decision.prefill_worker.unwrap_or(decision.decode_worker),
                decode_worker: decision.decode_worker,
                prefill_tokens: decision.prefill_tokens,
                decode_blocks: request.num_blocks,
                prefill_open: true,
                at_ms: now_ms,
            },
            if self.chooser.counts_distinct_blocks() {
                request.blocks
            } else {
                &[]
            },
        );
        if let Some(session) = request.session {
            self.pool.remember(
                session,
                Affinity {
                    decode: decision.decode_worker,
                    prefill: decision.prefill_worker,
                },
            );
        }
        Ok(decision)
    }
}

#[cfg(test)]
mod affinity_tests;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;
