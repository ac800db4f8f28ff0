//! kvrouter's policy: every candidate priced by predicted time to first
//! token (cost.rs), plus the congestion its extra prefill passes on, the
//! cheapest picked fairly (select.rs), and the prefill split off to a
//! prefill worker when that is faster. Design notes: README.md.

use super::calibrate::Calibrator;
use super::config::PolicyConfig;
use super::cost::{Coefficients, Cost, Request};
use super::lifetime::moving_average;
use super::pool::Pool;
use super::select::{Candidate, Pick, Rng};
use super::{Decision, Overlaps, RouteError, RoutingPolicy, Timing};
use crate::ids::WorkerId;
use crate::index::TierDepths;
use rustc_hash::FxHashMap;

pub struct CostPolicy {
    config: PolicyConfig,
    calibrator: Calibrator,
    rng: Rng,
    turn: u64,
    /// Moving average of each request's least prefill work (ms): the size
    /// of the requests a backlog is made of, for `Cost::congestion_ms`.
    typical_work_ms: Option<f64>,
    /// Moving average of each request's least predicted TTFT (ms): the
    /// typical first token, for `Cost::tail_ms`.
    typical_ttft_ms: Option<f64>,
    /// Per worker, moving sums of the prompt blocks routed there and of
    /// those its cache held: their ratio, the share of its traffic's blocks
    /// that hit, is what a block it evicts is worth to later requests
    /// (`Cost::pollution_ms`). Weighted by blocks, so that a long hot
    /// prompt is not outweighed by many short one-offs. A worker not yet
    /// routed to counts 0. Kept only while pollution is priced.
    hits: FxHashMap<WorkerId, (f64, f64)>,
    /// Moving average of whether a request went to a decode worker with
    /// the fewest requests in flight: how often an arrival evens out an
    /// imbalance, for `Cost::slowdown_ms`'s horizon. Pool-wide, over every
    /// model's decisions, as the stays it divides are.
    evening_share: Option<f64>,
}

/// Weight of each request in the policy's running averages
/// (`typical_work_ms`, `typical_ttft_ms`, `evening_share`).
const PER_REQUEST_ALPHA: f64 = 0.02;
/// Weight of each request in a worker's hit rate.
const HIT_RATE_ALPHA: f64 = 0.05;
/// The least typical TTFT the tail term divides by: below it (a cost model
/// calibrated to nearly free prefills) the ratio would be no measure.
const MIN_TYPICAL_TTFT_MS: f64 = 1.0;

impl CostPolicy {
    pub fn new(config: &PolicyConfig) -> Self {
        CostPolicy {
            calibrator: Calibrator::new(config.calibration_alpha),
            rng: Rng::new(config.seed),
            config: config.clone(),
            turn: 0,
            typical_work_ms: None,
            typical_ttft_ms: None,
            hits: FxHashMap::default(),
            evening_share: None,
        }
    }

    /// Folds what the chosen worker's cache held of the prompt into its hit rate.
    fn observe_hits(&mut self, request: &Request, worker: WorkerId, overlap: TierDepths) {
        let (hit, routed) = self.hits.entry(worker).or_default();
        *hit += HIT_RATE_ALPHA * (f64::from(overlap.total()) - *hit);
        *routed += HIT_RATE_ALPHA * (request.num_blocks as f64 - *routed);
    }

    fn hit_rate(&self, worker: WorkerId) -> f64 {
        match self.hits.get(&worker) {
            Some(&(hit, routed)) if routed > 0.0 => hit / routed,
            _ => 0.0,
        }
    }

    fn candidates(
        &self,
        pool: &Pool,
        request: &Request,
        overlaps: Overlaps<'_>,
        prefill_pool: bool,
    ) -> Vec<Candidate> {
        let mut out: Vec<Candidate> = pool
            .eligible(request, prefill_pool)
            .into_iter()
            .map(|worker| {
                let load = pool.load(worker);
                let overlap = overlap_of(overlaps, worker);
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
        if let Some(typical) = self.typical_work_ms {
            // Behind it wait the requests its backlog stands for and those
            // that arrive at this worker before its first token.
            let least = least_of(&out, Cost::work_ms);
            let in_flight = out.iter().map(|c| c.active_requests).sum();
            let per_worker = pool.lifetime.arrivals_per_ms(in_flight) / out.len().max(1) as f64;
            for c in out.iter_mut() {
                let behind = c.cost.queue_ms / typical.max(f64::MIN_POSITIVE)
                    + per_worker * c.cost.ttft_ms();
                c.cost.congestion_ms =
                    self.config.congestion_weight * (c.cost.work_ms() - least) * behind;
            }
        }
        if self.config.pollution_weight > 0.0 && request.num_blocks > 0 {
            let cached_anywhere = out.iter().map(|c| c.overlap.total()).max().unwrap_or(0);
            let reuse = f64::from(cached_anywhere) / request.num_blocks as f64;
            for c in out.iter_mut() {
                let hit_rate = self.hit_rate(c.worker);
                c.cost.pollution_ms = self.config.pollution_weight
                    * self.config.coefficients.pollution(
                        request,
                        c.overlap,
                        &pool.load(c.worker),
                        hit_rate,
                        reuse,
                    );
            }
        }
        if !prefill_pool {
            // Prefill-role workers run no decodes; decode-capable ones price
            // what the request does to the streams running there.
            let steps = pool.lifetime.shared_steps(
                out.iter().map(|c| c.active_requests).sum(),
                self.evening_share.unwrap_or(1.0),
            );
            for c in out.iter_mut() {
                let load = pool.load(c.worker);
                (c.cost.stall_ms, c.cost.slowdown_ms) =
                    self.config
                        .coefficients
                        .decode_impact(request, &load, c.cost.work_ms(), steps);
            }
        }
        for c in out.iter_mut() {
            c.cost.tail_ms = self.tail_ms(&c.cost);
        }
        self.config.selector.mark_overloaded(&mut out);
        out
    }

    /// `Cost::tail_ms`: a wait far past the typical first token is what the
    /// slowest first tokens are made of, and a sum of latencies weighs it
    /// no more than the same milliseconds spread over the streams.
    fn tail_ms(&self, cost: &Cost) -> f64 {
        match self.typical_ttft_ms {
            Some(typical) if self.config.tail_weight > 0.0 && cost.queue_ms > 0.0 => {
                let past_typical = cost.ttft_ms() / typical.max(MIN_TYPICAL_TTFT_MS) - 1.0;
                self.config.tail_weight * cost.queue_ms * past_typical.max(0.0)
            }
            _ => 0.0,
        }
    }

    /// Folds this request's least prefill work and least TTFT into
    /// `typical_work_ms` and `typical_ttft_ms`.
    fn observe_typical(&mut self, candidates: &[Candidate]) {
        if candidates.is_empty() {
            return;
        }
        let least_work = least_of(candidates, Cost::work_ms);
        let least_ttft = least_of(candidates, Cost::ttft_ms);
        self.typical_work_ms = Some(moving_average(
            self.typical_work_ms,
            least_work,
            PER_REQUEST_ALPHA,
        ));
        self.typical_ttft_ms = Some(moving_average(
            self.typical_ttft_ms,
            least_ttft,
            PER_REQUEST_ALPHA,
        ));
    }

    /// Folds whether the decision sent its request to a decode worker with
    /// the fewest requests in flight into `evening_share`.
    fn observe_evening(&mut self, decision: &Decision) {
        let candidates = &decision.decode_candidates;
        let chosen = candidates
            .iter()
            .find(|c| c.worker == decision.decode_worker)
            .expect("the decode worker is one of its candidates");
        let to_fewest = candidates
            .iter()
            .all(|c| chosen.active_requests <= c.active_requests);
        let evened = if to_fewest { 1.0 } else { 0.0 };
        self.evening_share = Some(moving_average(
            self.evening_share,
            evened,
            PER_REQUEST_ALPHA,
        ));
    }

    /// One decision's picks share its turn: were each pick to advance it, a
    /// decision that picks twice would step the rotation by two, and with
    /// an even number of tied workers half of them would never be chosen.
    fn pick(
        &mut self,
        candidates: &[Candidate],
        prefer: Option<WorkerId>,
    ) -> Option<(usize, Pick)> {
        self.config
            .selector
            .pick(candidates, &mut self.rng, self.turn, prefer)
    }

    /// Where the request goes: the cheapest decode candidate, prefilling
    /// there or on the cheapest prefill worker, whichever is faster.
    fn place(
        &mut self,
        pool: &Pool,
        request: &Request,
        overlaps: Overlaps<'_>,
    ) -> Result<Decision, RouteError> {
        self.turn += 1;
        let affinity = pool.affinity(request.session);
        let prefer_decode = affinity.map(|a| a.decode);
        let local = self.candidates(pool, request, overlaps, false);
        self.observe_typical(&local);
        let Some((d, how)) = self.pick(&local, prefer_decode) else {
            return Err(RouteError::NoWorker {
                blocks: request.num_blocks,
                registered: pool.serving(request.model),
            });
        };
        let coefficients = self.config.coefficients;
        let uncached_local = coefficients.uncached_tokens(request, local[d].overlap);
        let prefill = self.candidates(pool, request, overlaps, true);
        let local_decision = |reason: String, prefill_candidates: Vec<Candidate>| Decision {
            decode_worker: local[d].worker,
            prefill_worker: None,
            predicted_ttft_ms: local[d].cost.ttft_ms(),
            prefill_tokens: uncached_local,
            reason,
            by_affinity: matches!(how, Pick::Affinity(_)),
            decode_candidates: local.clone(),
            prefill_candidates,
        };
        let Some((p, how_prefill)) = self.pick(&prefill, affinity.and_then(|a| a.prefill)) else {
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
        // worker, the transfer of what it lacks, its own decode pressure and
        // the slowdown it brings to the streams decoding there (the prefill
        // ran elsewhere, so they do not stall for it).
        let split: Vec<Candidate> = local
            .iter()
            .map(|c| {
                let load = pool.load(c.worker);
                let side = coefficients.decode_cost(request, c.overlap, &load);
                let mut cost = prefill[p].cost;
                cost.decode_ms += side.decode_ms;
                cost.transfer_ms = side.transfer_ms;
                cost.overflow_ms += side.overflow_ms;
                cost.slowdown_ms = c.cost.slowdown_ms;
                // The blocks it lacks are moved into its cache as well.
                cost.pollution_ms += c.cost.pollution_ms;
                // The wait is the prefill worker's, the first token the pair's.
                cost.tail_ms = self.tail_ms(&cost);
                Candidate { cost, ..*c }
            })
            .collect();
        let (d, how) = self
            .pick(&split, prefer_decode)
            .expect("same workers as the local pick");
        Ok(Decision {
            decode_worker: split[d].worker,
            prefill_worker: Some(prefill[p].worker),
            predicted_ttft_ms: split[d].cost.ttft_ms(),
            prefill_tokens: coefficients.uncached_tokens(request, prefill[p].overlap),
            reason: format!(
                "disaggregated: prefill on worker {} ({}), decode on {}",
                prefill[p].worker.0,
                explain(how_prefill, &prefill, p),
                explain(how, &split, d)
            ),
            by_affinity: matches!(how, Pick::Affinity(_))
                || matches!(how_prefill, Pick::Affinity(_)),
            decode_candidates: split,
            prefill_candidates: prefill,
        })
    }
}

impl RoutingPolicy for CostPolicy {
    fn decide(
        &mut self,
        pool: &Pool,
        request: &Request,
        overlaps: Overlaps<'_>,
    ) -> Result<Decision, RouteError> {
        let decision = self.place(pool, request, overlaps)?;
        self.observe_evening(&decision);
        if self.config.pollution_weight > 0.0 {
            for worker in [Some(decision.decode_worker), decision.prefill_worker]
                .into_iter()
                .flatten()
            {
                self.observe_hits(request, worker, overlap_of(overlaps, worker));
            }
            // Workers come and go under new ids: forget those that left.
            if self.hits.len() > 2 * pool.len() + 16 {
                self.hits.retain(|worker, _| pool.worker(*worker).is_some());
            }
        }
        Ok(decision)
    }

    fn observe(&mut self, timing: Timing) {
        if !self.config.calibrate {
            return;
        }
        let c = &mut self.config.coefficients;
        match timing {
            Timing::Prefill {
                new_tokens,
                cached_tokens,
                ms,
            } => self
                .calibrator
                .observe_prefill(c, new_tokens, cached_tokens, ms),
            Timing::DecodeStep { active_blocks, ms } => {
                self.calibrator.observe_decode_step(c, active_blocks, ms)
            }
            Timing::Transfer { blocks, ms } => self.calibrator.observe_transfer(c, blocks, ms),
        }
    }

    fn coefficients(&self) -> Option<Coefficients> {
        Some(self.config.coefficients)
    }
}

pub(super) fn overlap_of(overlaps: Overlaps<'_>, worker: WorkerId) -> TierDepths {
    overlaps
        .iter()
        .find(|(id, _)| *id == worker)
        .map_or(TierDepths::default(), |o| o.1)
}

/// The least of one part of the candidates' costs.
fn least_of(candidates: &[Candidate], part: fn(&Cost) -> f64) -> f64 {
    candidates
        .iter()
        .map(|c| part(&c.cost))
        .fold(f64::INFINITY, f64::min)
}

fn explain(how: Pick, candidates: &[Candidate], winner: usize) -> String {
    let c = &candidates[winner];
    let skipped = candidates.iter().filter(|c| c.overloaded).count();
    let base = match how {
        Pick::Cheapest => format!(
            "worker {} has the lowest cost ({:.1} ms, {} blocks cached)",
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
        Pick::Affinity(n) => format!(
            "worker {} among {n} tied at ~{:.1} ms: session affinity (the session's last worker)",
            c.worker.0,
            c.cost.total()
        ),
        Pick::Sampled => format!(
            "worker {} sampled by temperature ({:.1} ms)",
            c.worker.0,
            c.cost.total()
        ),
    };
    let k = &c.cost;
    let terms = format!(
        "{base}; cost: TTFT {:.1} + queued behind {:.1} + streams stalled {:.1} + slowdown {:.1} \
         + evicted hits {:.1} + tail {:.1}",
        k.ttft_ms(),
        k.congestion_ms,
        k.stall_ms,
        k.slowdown_ms,
        k.pollution_ms,
        k.tail_ms
    );
    if skipped > 0 {
        format!("{terms}; skipped {skipped} overloaded")
    } else {
        terms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{ModelId, Role, Serves};

    /// Workers that leave under ids never seen again take their hit rates
    /// with them: what pollution pricing keeps stays about the pool's size.
    #[test]
    fn hit_rates_of_workers_that_left_are_forgotten() {
        let mut policy = CostPolicy::new(&PolicyConfig {
            pollution_weight: 1.0,
            ..PolicyConfig::default()
        });
        let mut pool = Pool::default();
        let request = Request {
            model: ModelId::UNNAMED,
            num_tokens: 640,
            num_blocks: 10,
            block_size: 64,
            ..Request::default()
        };
        for id in 0..200 {
            pool.upsert_worker(WorkerId(id), Role::Both, 1_000, &Serves::default());
            policy.decide(&pool, &request, &[]).unwrap();
            pool.remove_worker(WorkerId(id)).unwrap();
        }
        assert!(
            policy.hits.len() <= 2 * pool.len() + 17,
            "{}",
            policy.hits.len()
        );
    }
}
