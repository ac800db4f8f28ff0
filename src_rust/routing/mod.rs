//! The routing decision, from prompt to booked workers, in one place:
//! hash → index lookup → policy → prediction → stats and decision record.
//! Every entry point (the `Route` and `RouteStream` wire path, proxied
//! `Generate`, the replay, router replicas) decides through
//! `Router::route`, so every decision is counted and logged alike.
//! Design note: README.md.

mod refusal;
mod stats;

pub use refusal::{Code, Refusal};
pub use stats::{
    json_lines, BookedAs, DecisionRecord, Histogram, RouteStats, LATENCY_BOUNDS, RATIO_BOUNDS,
};

use crate::hashing::{model_namespace, BlockHasher};
use crate::ids::{SeqHash, WorkerId};
use crate::index::PrefixIndex;
use crate::policy::{
    Booking, Coefficients, Decision, Load, Policy, PolicyConfig, Pool, Request, RouteError,
    SessionKey, Timing, ADAPTER_SEPARATOR,
};
use parking_lot::Mutex;
use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Past this many predicted blocks in the index, routing adds no more.
pub const MAX_APPROXIMATE_BLOCKS: usize = 1_000_000;

/// A prompt as the caller has it: tokens (hashed here, in the model's
/// namespace salted by `namespace`: `hashing::model_namespace`), or block
/// hashes already made, with the prompt's token count if known.
#[derive(Copy, Clone, Debug)]
pub enum Prompt<'a> {
    Tokens {
        tokens: &'a [u32],
        namespace: &'a str,
    },
    Hashes {
        hashes: &'a [SeqHash],
        num_tokens: Option<u64>,
    },
}

/// A decision and what it was made for.
#[derive(Clone, Debug, PartialEq)]
pub struct Routed {
    pub request_id: String,
    pub decision: Decision,
    /// Full blocks of the prompt.
    pub num_blocks: u64,
}

/// A change to this router's bookings, for replicas that share them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BookingChange {
    Routed {
        request_id: String,
        booking: Booking,
    },
    PrefillDone {
        request_id: String,
    },
    Released {
        request_id: String,
    },
}

/// What a router keeps beside its decisions.
#[derive(Clone, Debug)]
pub struct RouterOptions {
    /// Ids for requests that come without one are `<prefix>-<n>`.
    pub id_prefix: String,
    pub latency_bounds: Vec<f64>,
    pub overlap_bounds: Vec<f64>,
    /// Keep a `DecisionRecord` of every decision for `take_records`.
    pub log_decisions: bool,
    /// Keep every booking change for `take_booking_changes`.
    pub share_bookings: bool,
}

impl Default for RouterOptions {
    fn default() -> Self {
        RouterOptions {
            id_prefix: "r".into(),
            latency_bounds: LATENCY_BOUNDS.to_vec(),
            overlap_bounds: RATIO_BOUNDS.to_vec(),
            log_decisions: false,
            share_bookings: false,
        }
    }
}

pub struct Router {
    block_size: u64,
    approximate_ttl: Option<Duration>,
    uses_index: bool,
    policy: Mutex<Policy>,
    id_prefix: String,
    next_id: AtomicU64,
    stats: Mutex<RouteStats>,
    records: Option<Mutex<Vec<DecisionRecord>>>,
    changes: Option<Mutex<Vec<BookingChange>>>,
}

impl Router {
    /// Err names the setting that is out of range.
    pub fn new(
        block_size: u64,
        config: PolicyConfig,
        options: RouterOptions,
    ) -> Result<Router, String> {
        if block_size == 0 {
            return Err("block_size must be positive".into());
        }
        config.validate()?;
        for bounds in [&options.latency_bounds, &options.overlap_bounds] {
            if bounds.windows(2).any(|w| w[0] >= w[1]) {
                return Err("histogram buckets must increase".into());
            }
        }
        let policy = Policy::new(config);
        Ok(Router {
            block_size,
            approximate_ttl: (policy.config.approximate_ttl_ms > 0)
                .then(|| Duration::from_millis(policy.config.approximate_ttl_ms)),
            uses_index: policy.uses_index(),
            policy: Mutex::new(policy),
            id_prefix: options.id_prefix,
            next_id: AtomicU64::new(0),
            stats: Mutex::new(RouteStats::new(
                options.latency_bounds,
                options.overlap_bounds,
            )),
            records: options.log_decisions.then(|| Mutex::new(Vec::new())),
            changes: options.share_bookings.then(|| Mutex::new(Vec::new())),
        })
    }

    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// False when the policy never looks at the index (round robin, random,
    /// least loaded): routing then skips the lookup.
    pub fn uses_index(&self) -> bool {
        self.uses_index
    }

    pub fn config(&self) -> PolicyConfig {
        self.policy.lock().config.clone()
    }

    /// Decides where the request goes, among the workers of `model` (a
    /// model, `model:adapter`, or empty for the unnamed model), and books
    /// it. An empty `request_id` gets one made here. A non-empty `session`
    /// sends it, among equally good workers, where the session's last
    /// request went (`policy::Selector::pick`). On refusal, returns the
    /// request id with the error; a refused request books nothing.
    pub fn route(
        &self,
        index: &PrefixIndex,
        request_id: &str,
        model: &str,
        session: &str,
        prompt: Prompt<'_>,
        now_ms: u64,
    ) -> Result<Routed, (String, RouteError)> {
        let started = Instant::now();
        let request_id = if request_id.is_empty() {
            let n = self.next_id.fetch_add(1, Ordering::Relaxed);
            format!("{}-{n}", self.id_prefix)
        } else {
            request_id.to_owned()
        };
        let hashed;
        let resolved;
        let (hashes, num_tokens, model) = match prompt {
            Prompt::Tokens { tokens, namespace } => {
                // An adapter named by itself hashes and routes as its
                // `model:adapter`, resolved once so that a registration in
                // between cannot part the two; a name several models have
                // as an adapter stays as it is, for the decision to refuse.
                resolved = self.canonical_model(model).unwrap_or(Cow::Borrowed(model));
                let namespace = model_namespace(&resolved, namespace);
                hashed = BlockHasher::for_namespace(self.block_size as usize, &namespace)
                    .seq_hashes(tokens);
                (hashed.as_slice(), tokens.len() as u64, resolved.as_ref())
            }
            // The decision resolves an adapter named by itself (`Pool::model`).
            Prompt::Hashes { hashes, num_tokens } => (
                hashes,
                num_tokens.unwrap_or(hashes.len() as u64 * self.block_size),
                model,
            ),
        };
        let session = SessionKey::of(session);
        match self.decide(
            index,
            &request_id,
            model,
            session,
            hashes,
            num_tokens,
            now_ms,
        ) {
            Ok(decision) => {
                let routed = Routed {
                    request_id,
                    decision,
                    num_blocks: hashes.len() as u64,
                };
                self.record(&routed, started.elapsed().as_secs_f64());
                Ok(routed)
            }
            Err(error) => {
                self.refused(Refusal::from(error.clone()).code);
                Err((request_id, error))
            }
        }
    }

    /// Looks the prompt's blocks up, lets the policy choose and book, and
    /// predicts the blocks on the chosen workers. Predictions are made only
    /// when the prefilling worker last reported a backlog: only then do its
    /// KV events come late enough for a session's next turn to miss them.
    /// An idle pool pays nothing for predictions, a policy that never reads
    /// the index makes none, and there are never more than
    /// `MAX_APPROXIMATE_BLOCKS`.
    #[allow(clippy::too_many_arguments)]
    fn decide(
        &self,
        index: &PrefixIndex,
        request_id: &str,
        model: &str,
        session: Option<SessionKey>,
        hashes: &[SeqHash],
        num_tokens: u64,
        now_ms: u64,
    ) -> Result<Decision, RouteError> {
        let matched = if hashes.is_empty() || !self.uses_index {
            Vec::new()
        } else {
            index.find_matches(hashes, false).scores
        };
        let (decision, backlogged) = {
            let mut policy = self.policy.lock();
            if policy.config.pollution_weight > 0.0 && self.uses_index {
                for worker in index.workers() {
                    policy
                        .pool
                        .set_cached_blocks(worker.worker, worker.blocks as u64);
                }
            }
            let request = Request {
                model: policy.pool.model(model)?,
                num_tokens,
                num_blocks: hashes.len() as u64,
                block_size: self.block_size,
                blocks: hashes,
                session,
            };
            let decision = policy.route(request_id, request, &matched, now_ms)?;
            let prefilling = decision.prefill_worker.unwrap_or(decision.decode_worker);
            let backlogged = policy.pool.reported_queue_tokens(prefilling) > 0;
            (decision, backlogged)
        };
        let predict =
            backlogged && self.uses_index && index.num_approximate() < MAX_APPROXIMATE_BLOCKS;
        if let Some(ttl) = self
            .approximate_ttl
            .filter(|_| predict && !hashes.is_empty())
        {
            for worker in [Some(decision.decode_worker), decision.prefill_worker]
                .into_iter()
                .flatten()
            {
                // Fails only past 2^24 workers; a missing prediction costs
                // routing quality, never correctness.
                let _ = index.insert_approximate(worker, hashes, ttl);
            }
        }
        Ok(decision)
    }

    /// Counts a request turned down, by status code.
    pub fn refused(&self, code: Code) {
        *self.stats.lock().errors.entry(code.name()).or_default() += 1;
    }

    fn record(&self, routed: &Routed, seconds: f64) {
        let d = &routed.decision;
        let overlap = d
            .decode_candidates
            .iter()
            .find(|c| c.worker == d.decode_worker)
            .map_or(0, |c| u64::from(c.overlap.total()));
        {
            let mut stats = self.stats.lock();
            stats.latency.observe(seconds);
            *stats
                .decisions
                .entry((d.decode_worker, BookedAs::Decode))
                .or_default() += 1;
            if let Some(prefill) = d.prefill_worker {
                *stats
                    .decisions
                    .entry((prefill, BookedAs::Prefill))
                    .or_default() += 1;
            }
            stats.by_affinity += u64::from(d.by_affinity);
            if routed.num_blocks > 0 {
                stats
                    .overlap
                    .observe(overlap as f64 / routed.num_blocks as f64);
            }
        }
        if let Some(records) = &self.records {
            let at = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |t| t.as_secs_f64());
            records.lock().push(DecisionRecord {
                at,
                request_id: routed.request_id.clone(),
                decode_worker: d.decode_worker.0,
                prefill_worker: d.prefill_worker.map(|w| w.0),
                blocks: routed.num_blocks,
                overlap,
                ttft_ms: (d.predicted_ttft_ms * 1e3).round() / 1e3,
                reason: d.reason.clone(),
                micros: (seconds * 1e7).round() / 10.0,
            });
        }
        self.note(|| BookingChange::Routed {
            request_id: routed.request_id.clone(),
            booking: Booking {
                prefill_worker: d.prefill_worker.unwrap_or(d.decode_worker),
                decode_worker: d.decode_worker,
                prefill_tokens: d.prefill_tokens,
                decode_blocks: routed.num_blocks,
                prefill_open: true,
                at_ms: 0,
            },
        });
    }

    fn note(&self, change: impl FnOnce() -> BookingChange) {
        if let Some(changes) = &self.changes {
            changes.lock().push(change());
        }
    }

    /// The request's prefill is done; false when it is unknown or already done.
    pub fn prefill_done(&self, request_id: &str) -> bool {
        let done = self.policy.lock().pool.prefill_done(request_id);
        if done {
            self.note(|| BookingChange::PrefillDone {
                request_id: request_id.to_owned(),
            });
        }
        done
    }

    /// The request finished or was cancelled: frees its load; false when it
    /// was not booked.
    pub fn release(&self, request_id: &str) -> bool {
        let released = self.policy.lock().pool.release(request_id);
        if released {
            self.note(|| BookingChange::Released {
                request_id: request_id.to_owned(),
            });
        }
        released
    }

    /// Takes a worker's load report; the bookings it no longer accounts for
    /// are retired, counted and shared as released. Returns how many.
    pub fn report_load(
        &self,
        worker: WorkerId,
        load: Load,
        now_ms: u64,
    ) -> Result<usize, RouteError> {
        let retired = self.policy.lock().report_load(worker, load, now_ms)?;
        if !retired.is_empty() {
            self.stats.lock().retired_unreported += retired.len() as u64;
            for request_id in &retired {
                self.note(|| BookingChange::Released {
                    request_id: request_id.clone(),
                });
            }
        }
        Ok(retired.len())
    }

    /// The name a request for `model` routes and hashes under: the
    /// `model:adapter` it means when it names an adapter by itself
    /// (`Pool::canonical_model`), else `model` as it is;
    /// `AmbiguousAdapter` when several models have that adapter.
    pub fn canonical_model<'a>(&self, model: &'a str) -> Result<Cow<'a, str>, RouteError> {
        if model.is_empty() || model.contains(ADAPTER_SEPARATOR) {
            return Ok(Cow::Borrowed(model));
        }
        Ok(match self.policy.lock().pool.canonical_model(model)? {
            Some(home) => Cow::Owned(home),
            None => Cow::Borrowed(model),
        })
    }

    /// Every model name served, with how many of its workers are routable
    /// now, sorted by name.
    pub fn models(&self) -> Vec<(String, usize)> {
        self.policy.lock().pool.models()
    }

    /// The predicted time the least loaded healthy worker of `model` needs
    /// for the prefill queued on it, in ms: past a bound, every worker of
    /// the model is saturated and a front door holds new requests back.
    /// None when no worker of the model is healthy.
    pub fn backlog_ms(&self, model: &str) -> Result<Option<f64>, RouteError> {
        let policy = self.policy.lock();
        let id = policy.pool.model(model)?;
        let coefficients = policy.coefficients();
        Ok(policy
            .pool
            .least_queued_prefill(id)
            .map(|tokens| coefficients.queue_ms(tokens as f64)))
    }

    /// Runs `f` on the pool: the registry and peers' bookings.
    pub fn with_pool<R>(&self, f: impl FnOnce(&mut Pool) -> R) -> R {
        f(&mut self.policy.lock().pool)
    }

    pub fn observe(&self, timing: Timing) {
        self.policy.lock().observe(timing);
    }

    /// The cost coefficients in use (after calibration).
    pub fn coefficients(&self) -> Coefficients {
        self.policy.lock().coefficients()
    }

    /// The load a worker is scored with; None for an unknown worker.
    pub fn load(&self, worker: WorkerId) -> Option<Load> {
        let policy = self.policy.lock();
        policy.pool.worker(worker)?;
        Some(policy.pool.load(worker))
    }

    /// This router's bookings, for a peer replica's copy of its book.
    pub fn own_bookings(&self) -> Vec<(String, Booking)> {
        let policy = self.policy.lock();
        policy
            .pool
            .book()
            .own()
            .map(|(id, b)| (id.clone(), b.clone()))
            .collect()
    }

    /// Requests this router booked and has not seen finish.
    pub fn booked(&self) -> usize {
        self.policy.lock().pool.book().len()
    }

    pub fn stats(&self) -> RouteStats {
        self.stats.lock().clone()
    }

    /// The decision records made since the last call (none when off).
    pub fn take_records(&self) -> Vec<DecisionRecord> {
        self.records
            .as_ref()
            .map(|r| std::mem::take(&mut *r.lock()))
            .unwrap_or_default()
    }

    /// The booking changes made since the last call (none when off).
    pub fn take_booking_changes(&self) -> Vec<BookingChange> {
        self.changes
            .as_ref()
            .map(|c| std::mem::take(&mut *c.lock()))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod session_tests;
#[cfg(test)]
mod tests;
