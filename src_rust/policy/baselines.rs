//! The baselines kvrouter is measured against, as policies on the same pool
//! and load book. Each sees only what a plain router has: the workers, what
//! it booked on them (and what they reported), and for the cache-aware ones
//! the index's overlaps. In a P/D pool they always split, choosing each
//! side by their rule.

use super::config::{PolicyConfig, PolicyName};
use super::cost::{Cost, Request};
use super::kv_cost::overlap_of;
use super::pool::Pool;
use super::select::{Candidate, Rng};
use super::{Decision, Overlaps, RouteError, RoutingPolicy};
use crate::ids::WorkerId;

pub struct Baseline {
    kind: PolicyName,
    rng: Rng,
    turn: u64,
}

impl Baseline {
    /// `kind` is any policy but `Kvrouter`.
    pub fn new(kind: PolicyName, config: &PolicyConfig) -> Self {
        debug_assert_ne!(kind, PolicyName::Kvrouter);
        Baseline {
            kind,
            rng: Rng::new(config.seed),
            turn: 0,
        }
    }

    /// Lower is better.
    fn score(&self, pool: &Pool, worker: WorkerId, request: &Request, overlaps: Overlaps) -> f64 {
        let load = pool.load(worker);
        let overlap = f64::from(overlap_of(overlaps, worker).total());
        match self.kind {
            PolicyName::LeastLoaded => load.active_requests as f64,
            // Most cached blocks first; among equals, the fewest active requests.
            PolicyName::OverlapOnly => -overlap + load.active_requests as f64 * 1e-6,
            // Dynamo's KV router's default cost, in blocks: the prefill
            // tokens queued there plus the request's uncached ones, and the
            // distinct blocks of the active requests plus the request's
            // blocks not among them (a prompt they share counts once).
            PolicyName::Dynamo => {
                let block_size = request.block_size.max(1);
                let new_tokens = request
                    .num_tokens
                    .saturating_sub(overlap as u64 * block_size);
                (load.queued_prefill_tokens + new_tokens) as f64 / block_size as f64
                    + (pool.distinct_active_blocks(worker)
                        + pool.new_active_blocks(worker, request)) as f64
            }
            PolicyName::Kvrouter | PolicyName::RoundRobin | PolicyName::Random => 0.0,
        }
    }

    /// The workers of `eligible` in the order this baseline prefers them:
    /// the chosen one first, the rest as retries should take them.
    fn rank(
        &mut self,
        pool: &Pool,
        eligible: &[WorkerId],
        request: &Request,
        overlaps: Overlaps,
    ) -> Vec<WorkerId> {
        let n = eligible.len();
        let first = match self.kind {
            // Both sides of a request take the same turn: P and D in step.
            PolicyName::RoundRobin => {
                let start = (self.turn % n as u64) as usize;
                return (0..n).map(|i| eligible[(start + i) % n]).collect();
            }
            PolicyName::Random => (self.rng.next_u64() % n as u64) as usize,
            _ => {
                let scores: Vec<f64> = eligible
                    .iter()
                    .map(|&w| self.score(pool, w, request, overlaps))
                    .collect();
                let best = scores.iter().copied().fold(f64::INFINITY, f64::min);
                let tied: Vec<usize> = (0..n).filter(|&i| scores[i] == best).collect();
                let first = tied[(self.rng.next_u64() % tied.len() as u64) as usize];
                let mut order: Vec<usize> = (0..n).filter(|&i| i != first).collect();
                order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
                return std::iter::once(first)
                    .chain(order)
                    .map(|i| eligible[i])
                    .collect();
            }
        };
        std::iter::once(first)
            .chain((0..n).filter(|&i| i != first))
            .map(|i| eligible[i])
            .collect()
    }

    fn candidates(pool: &Pool, ranked: &[WorkerId], overlaps: Overlaps) -> Vec<Candidate> {
        ranked
            .iter()
            .map(|&worker| Candidate {
                worker,
                overlap: overlap_of(overlaps, worker),
                cost: Cost::default(),
                active_requests: pool.load(worker).active_requests,
                overloaded: false,
            })
            .collect()
    }
}

impl RoutingPolicy for Baseline {
    fn decide(
        &mut self,
        pool: &Pool,
        request: &Request,
        overlaps: Overlaps,
    ) -> Result<Decision, RouteError> {
        let decode_pool = pool.eligible(request, false);
        if decode_pool.is_empty() {
            return Err(RouteError::NoWorker {
                blocks: request.num_blocks,
                registered: pool.serving(request.model),
            });
        }
        let decode = self.rank(pool, &decode_pool, request, overlaps);
        let prefill_pool = pool.eligible(request, true);
        let prefill = if prefill_pool.is_empty() {
            Vec::new()
        } else {
            self.rank(pool, &prefill_pool, request, overlaps)
        };
        self.turn += 1;
        let prefill_worker = prefill.first().copied();
        let prefilling = prefill_worker.unwrap_or(decode[0]);
        let cached = u64::from(overlap_of(overlaps, prefilling).total()) * request.block_size;
        let split = match prefill_worker {
            Some(p) => format!("; prefill on worker {}", p.0),
            None => String::new(),
        };
        Ok(Decision {
            decode_worker: decode[0],
            prefill_worker,
            predicted_ttft_ms: 0.0,
            prefill_tokens: request.num_tokens.saturating_sub(cached),
            reason: format!("{}: worker {}{split}", self.kind.name(), decode[0].0),
            by_affinity: false,
            decode_candidates: Self::candidates(pool, &decode, overlaps),
            prefill_candidates: Self::candidates(pool, &prefill, overlaps),
        })
    }

    fn uses_index(&self) -> bool {
        matches!(self.kind, PolicyName::OverlapOnly | PolicyName::Dynamo)
    }

    fn counts_distinct_blocks(&self) -> bool {
        self.kind == PolicyName::Dynamo
    }
}
