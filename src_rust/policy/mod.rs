//! The routing policy: score every candidate worker by predicted time to
//! first token, pick one fairly, and book the load it adds. Design notes:
//! README.md.

mod book;
mod calibrate;
mod cost;
mod select;

pub use book::{Booked, Booking, LoadBook};
pub use calibrate::Calibrator;
pub use cost::{Coefficients, Cost, Load, Request};
pub use select::{Candidate, Pick, Rng, Selector};

use crate::ids::WorkerId;
use crate::index::TierDepths;
use hashbrown::HashMap;

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

/// What the policy knows of one worker.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct WorkerState {
    pub role: Role,
    pub capacity_blocks: u64,
    pub healthy: bool,
    /// The worker's own last report (queued prefill tokens, active decode
    /// blocks, active requests); the booked load covers what it has not
    /// reported yet, and the larger of the two counts.
    pub reported: Load,
}

#[derive(Clone, Debug)]
pub struct PolicyConfig {
    pub coefficients: Coefficients,
    pub selector: Selector,
    pub calibrate: bool,
    pub calibration_alpha: f64,
    pub seed: u64,
    /// Prefill on the decode worker when its cache leaves at most this many
    /// tokens to compute...
    pub local_prefill_max_tokens: u64,
    /// ...or when the least-queued prefill worker has this much queued (ms).
    pub prefill_saturation_ms: f64,
    pub stale_after_ms: u64,
    /// Scales `Cost::congestion_ms`; 0 prices each request's own TTFT only.
    pub congestion_weight: f64,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
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
            congestion_weight: 1.0,
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
    /// Decode-side candidates; in a split their cost includes the chosen prefill.
    pub decode_candidates: Vec<Candidate>,
    pub prefill_candidates: Vec<Candidate>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("request {0:?} is already routed")]
    DuplicateRequest(String),
    #[error("no healthy decode-capable worker with room for {blocks} blocks ({registered} workers registered)")]
    NoWorker { blocks: u64, registered: usize },
    #[error("unknown worker {0}")]
    UnknownWorker(u64),
}

pub struct Policy {
    pub config: PolicyConfig,
    workers: HashMap<WorkerId, WorkerState>,
    book: LoadBook,
    calibrator: Calibrator,
    rng: Rng,
    turn: u64,
    /// Moving average of each request's least prefill work (ms): the size
    /// of the requests a backlog is made of, for `Cost::congestion_ms`.
    typical_work_ms: Option<f64>,
}

impl Policy {
    pub fn new(config: PolicyConfig) -> Self {
        Policy {
            calibrator: Calibrator::new(config.calibration_alpha),
            rng: Rng::new(config.seed),
            config,
            workers: HashMap::new(),
            book: LoadBook::default(),
            turn: 0,
            typical_work_ms: None,
        }
    }

    pub fn upsert_worker(&mut self, worker: WorkerId, role: Role, capacity_blocks: u64) {
        let state = self.workers.entry(worker).or_insert(WorkerState {
            role,
            capacity_blocks,
            healthy: true,
            reported: Load::default(),
        });
        state.role = role;
        state.capacity_blocks = capacity_blocks;
    }

    /// Forgets the worker and releases the requests booked on it.
    pub fn remove_worker(&mut self, worker: WorkerId) -> Result<Vec<String>, RouteError> {
        self.workers
            .remove(&worker)
            .ok_or(RouteError::UnknownWorker(worker.0))?;
        Ok(self.book.drop_worker(worker))
    }

    pub fn set_healthy(&mut self, worker: WorkerId, healthy: bool) -> Result<(), RouteError> {
        self.worker_mut(worker)?.healthy = healthy;
        Ok(())
    }

    pub fn report_load(&mut self, worker: WorkerId, load: Load) -> Result<(), RouteError> {
        let state = self.worker_mut(worker)?;
        state.reported = Load {
            capacity_blocks: state.capacity_blocks,
            ..load
        };
        Ok(())
    }

    /// Prefill tokens the worker last reported queued, less what finished since.
    pub fn reported_queue_tokens(&self, worker: WorkerId) -> u64 {
        self.workers
            .get(&worker)
            .map_or(0, |s| s.reported.queued_prefill_tokens)
    }

    pub fn workers(&self) -> impl Iterator<Item = (WorkerId, &WorkerState)> {
        self.workers.iter().map(|(id, state)| (*id, state))
    }

    pub fn book(&self) -> &LoadBook {
        &self.book
    }

    /// A worker's last report counted the request's work; the report stays
    /// until the next one, so the work done since comes off it here.
    pub fn prefill_done(&mut self, request_id: &str) -> bool {
        let Some((worker, tokens)) = self.book.prefill_done(request_id) else {
            return false;
        };
        self.discount_report(worker, tokens, 0, 0);
        true
    }

    pub fn release(&mut self, request_id: &str) -> bool {
        let Some(booking) = self.book.release(request_id) else {
            return false;
        };
        if booking.prefill_open {
            self.discount_report(booking.prefill_worker, booking.prefill_tokens, 0, 0);
        }
        self.discount_report(booking.decode_worker, 0, booking.decode_blocks, 1);
        true
    }

    fn discount_report(&mut self, worker: WorkerId, tokens: u64, blocks: u64, requests: u64) {
        if let Some(state) = self.workers.get_mut(&worker) {
            let r = &mut state.reported;
            r.queued_prefill_tokens = r.queued_prefill_tokens.saturating_sub(tokens);
            r.active_decode_blocks = r.active_decode_blocks.saturating_sub(blocks);
            r.active_requests = r.active_requests.saturating_sub(requests);
        }
    }

    pub fn observe_prefill(&mut self, new_tokens: f64, cached_tokens: f64, ms: f64) {
        if self.config.calibrate {
            self.calibrator.observe_prefill(
                &mut self.config.coefficients,
                new_tokens,
                cached_tokens,
                ms,
            );
        }
    }

    pub fn observe_decode_step(&mut self, active_blocks: f64, ms: f64) {
        if self.config.calibrate {
            self.calibrator
                .observe_decode_step(&mut self.config.coefficients, active_blocks, ms);
        }
    }

    pub fn observe_transfer(&mut self, blocks: f64, ms: f64) {
        if self.config.calibrate {
            self.calibrator
                .observe_transfer(&mut self.config.coefficients, blocks, ms);
        }
    }

    fn worker_mut(&mut self, worker: WorkerId) -> Result<&mut WorkerState, RouteError> {
        self.workers
            .get_mut(&worker)
            .ok_or(RouteError::UnknownWorker(worker.0))
    }

    /// The load a worker is scored with: the larger of booked and reported.
    pub fn load(&self, worker: WorkerId) -> Load {
        let state = &self.workers[&worker];
        let booked = self.book.booked(worker);
        Load {
            queued_prefill_tokens: booked
                .prefill_tokens
                .max(state.reported.queued_prefill_tokens),
            active_decode_blocks: booked
                .decode_blocks
                .max(state.reported.active_decode_blocks),
            active_requests: booked.requests.max(state.reported.active_requests),
            capacity_blocks: state.capacity_blocks,
        }
    }

    /// Scores all candidates, picks the prefill and decode workers, and books
    /// the request on them. `overlaps` are the index's matches for the
    /// request's blocks.
    pub fn route(
        &mut self,
        request_id: &str,
        request: Request,
        overlaps: &[(WorkerId, TierDepths)],
        now_ms: u64,
    ) -> Result<Decision, RouteError> {
        self.book
            .expire(now_ms.saturating_sub(self.config.stale_after_ms));
        if self.book.contains(request_id) {
            return Err(RouteError::DuplicateRequest(request_id.to_string()));
        }
        let decision = self.decide(&request, overlaps)?;
        self.book.charge(
            request_id.to_string(),
            Booking {
                prefill_worker: decision.prefill_worker.unwrap_or(decision.decode_worker),
                decode_worker: decision.decode_worker,
                prefill_tokens: decision.prefill_tokens,
                decode_blocks: request.num_blocks,
                prefill_open: true,
                at_ms: now_ms,
            },
        );
        Ok(decision)
    }

    fn candidates(
        &self,
        request: &Request,
        overlaps: &[(WorkerId, TierDepths)],
        prefill_pool: bool,
    ) -> Vec<Candidate> {
        let overlap_of = |w: WorkerId| {
            overlaps
                .iter()
                .find(|(id, _)| *id == w)
                .map_or(TierDepths::default(), |o| o.1)
        };
        let mut out: Vec<Candidate> = self
            .workers
            .iter()
            .filter(|(_, s)| {
                s.healthy
                    && s.capacity_blocks >= request.num_blocks
                    && (s.role == Role::Prefill) == prefill_pool
            })
            .map(|(&worker, _)| {
                let load = self.load(worker);
                let overlap = overlap_of(worker);
                Candidate {
                    worker,
                    overlap,
                    cost: self
                        .config
                        .coefficients
                        .prefill_cost(request, overlap, &load),
                    active_requests: load.active_requests,
                    overloaded: false,
                }
            })
            .collect();
        out.sort_by_key(|c| c.worker);
        if let Some(typical) = self.typical_work_ms {
            let least = least_work_ms(&out);
            let weight = self.config.congestion_weight / typical.max(f64::MIN_POSITIVE);
            for c in out.iter_mut() {
                c.cost.congestion_ms = weight * (c.cost.work_ms() - least) * c.cost.queue_ms;
            }
        }
        self.config.selector.mark_overloaded(&mut out);
        out
    }

    /// Folds this request's least prefill work into `typical_work_ms`.
    fn observe_work(&mut self, candidates: &[Candidate]) {
        if candidates.is_empty() {
            return;
        }
        let least = least_work_ms(candidates);
        self.typical_work_ms = Some(match self.typical_work_ms {
            Some(typical) => typical + TYPICAL_WORK_ALPHA * (least - typical),
            None => least,
        });
    }

    fn pick(&mut self, candidates: &[Candidate]) -> Option<(usize, Pick)> {
        self.turn += 1;
        self.config
            .selector
            .pick(candidates, &mut self.rng, self.turn)
    }

    fn decide(
        &mut self,
        request: &Request,
        overlaps: &[(WorkerId, TierDepths)],
    ) -> Result<Decision, RouteError> {
        let local = self.candidates(request, overlaps, false);
        self.observe_work(&local);
        let Some((d, how)) = self.pick(&local) else {
            return Err(RouteError::NoWorker {
                blocks: request.num_blocks,
                registered: self.workers.len(),
            });
        };
        let coefficients = self.config.coefficients;
        let uncached_local = coefficients.uncached_tokens(request, local[d].overlap);
        let prefill = self.candidates(request, overlaps, true);
        let local_decision = |reason: String, prefill_candidates: Vec<Candidate>| Decision {
            decode_worker: local[d].worker,
            prefill_worker: None,
            predicted_ttft_ms: local[d].cost.total(),
            prefill_tokens: uncached_local,
            reason,
            decode_candidates: local.clone(),
            prefill_candidates,
        };
        let Some((p, _)) = self.pick(&prefill) else {
            return Ok(local_decision(explain(how, &local, d), prefill));
        };
        if uncached_local <= self.config.local_prefill_max_tokens {
            let reason = format!(
                "{}; prefilled locally: only {uncached_local} uncached tokens (threshold {})",
                explain(how, &local, d),
                self.config.local_prefill_max_tokens
            );
            return Ok(local_decision(reason, prefill));
        }
        if prefill[p].cost.queue_ms >= self.config.prefill_saturation_ms {
            let reason = format!(
                "{}; prefilled locally: prefill pool saturated ({:.0} ms queued on the least busy)",
                explain(how, &local, d),
                prefill[p].cost.queue_ms
            );
            return Ok(local_decision(reason, prefill));
        }
        // The pair cost is separable: the best prefill worker plus, per decode
        // worker, the transfer of what it lacks and its own decode pressure.
        let split: Vec<Candidate> = local
            .iter()
            .map(|c| {
                let load = self.load(c.worker);
                let side = coefficients.decode_cost(request, c.overlap, &load);
                let mut cost = prefill[p].cost;
                cost.decode_ms += side.decode_ms;
                cost.transfer_ms = side.transfer_ms;
                cost.overflow_ms += side.overflow_ms;
                Candidate { cost, ..*c }
            })
            .collect();
        let (d, how) = self.pick(&split).expect("same workers as the local pick");
        Ok(Decision {
            decode_worker: split[d].worker,
            prefill_worker: Some(prefill[p].worker),
            predicted_ttft_ms: split[d].cost.total(),
            prefill_tokens: coefficients.uncached_tokens(request, prefill[p].overlap),
            reason: format!(
                "disaggregated: prefill on worker {} ({}), decode on {}",
                prefill[p].worker.0,
                explain(Pick::Cheapest, &prefill, p),
                explain(how, &split, d)
            ),
            decode_candidates: split,
            prefill_candidates: prefill,
        })
    }
}

/// Weight of each request in `typical_work_ms`.
const TYPICAL_WORK_ALPHA: f64 = 0.02;

fn least_work_ms(candidates: &[Candidate]) -> f64 {
    candidates
        .iter()
        .map(|c| c.cost.work_ms())
        .fold(f64::INFINITY, f64::min)
}

fn explain(how: Pick, candidates: &[Candidate], winner: usize) -> String {
    let c = &candidates[winner];
    let skipped = candidates.iter().filter(|c| c.overloaded).count();
    let base = match how {
        Pick::Cheapest => format!(
            "worker {} has the lowest predicted TTFT ({:.1} ms, {} blocks cached)",
            c.worker.0,
            c.cost.total(),
            c.overlap.total()
        ),
        Pick::Tie(n) => format!(
            "worker {} among {n} tied at ~{:.1} ms: fewest active requests ({}), then in turn",
            c.worker.0,
            c.cost.total(),
            c.active_requests
        ),
        Pick::Sampled => format!(
            "worker {} sampled by temperature ({:.1} ms)",
            c.worker.0,
            c.cost.total()
        ),
    };
    if skipped > 0 {
        format!("{base}; skipped {skipped} overloaded")
    } else {
        base
    }
}

#[cfg(test)]
mod tests;
