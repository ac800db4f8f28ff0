//! `WireRouter` for Python: the Route RPC from request bytes to response
//! bytes in one call with the GIL released, keeping its metrics and
//! decision-log records on the Rust side until they are read.

use super::index::PyPrefixIndex;
use super::policy::PyRoutingCore;
use crate::hashing::BlockHasher;
use crate::ids::WorkerId;
use crate::policy::Decision;
use crate::wire::{
    self, BookedAs, DecisionRecord, Directory, Histogram, Limits, Refusal, RouteStats,
};
use parking_lot::{Mutex, RwLock};
use prost::Message;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

create_exception!(
    kvrouter._core,
    RouteRefused,
    PyException,
    "A routing request the router turns down. args: (code, message, request_id), the code as grpc.StatusCode names it."
);

struct Routed {
    response: Vec<u8>,
    request_id: String,
    decision: Decision,
    num_blocks: u64,
}

/// (response bytes, request id, decode worker, prefill worker or None,
///  prefill tokens, prompt blocks)
type RoutedRow<'py> = (Bound<'py, PyBytes>, String, u64, Option<u64>, u64, u64);

/// (buckets' counts with +Inf last, sum)
type HistogramRow = (Vec<u64>, f64);

/// (decisions as (worker, "decode"|"prefill", count), errors as (code, count),
///  latency, overlap)
type StatsRow = (
    Vec<(u64, &'static str, u64)>,
    Vec<(&'static str, u64)>,
    HistogramRow,
    HistogramRow,
);

#[pyclass(name = "WireRouter", module = "kvrouter._core", frozen)]
pub struct PyWireRouter {
    core: Py<PyRoutingCore>,
    index: Py<PyPrefixIndex>,
    limits: Limits,
    approximate_ttl: Option<Duration>,
    id_prefix: String,
    next_id: AtomicU64,
    directory: RwLock<Directory>,
    stats: Mutex<RouteStats>,
    decisions: Option<Mutex<Vec<DecisionRecord>>>,
}

impl PyWireRouter {
    fn route_bytes(&self, bytes: &[u8], now_ms: u64) -> Result<Routed, (String, Refusal)> {
        let started = Instant::now();
        let outcome = self.try_route(bytes, now_ms);
        match &outcome {
            Ok(routed) => self.record(routed, started.elapsed().as_secs_f64()),
            Err((_, refusal)) => {
                *self
                    .stats
                    .lock()
                    .errors
                    .entry(refusal.code.name())
                    .or_default() += 1;
            }
        }
        outcome
    }

    fn try_route(&self, bytes: &[u8], now_ms: u64) -> Result<Routed, (String, Refusal)> {
        let request = wire::parse(bytes, &self.limits)?;
        let request_id = if request.request_id.is_empty() {
            let n = self.next_id.fetch_add(1, Ordering::Relaxed);
            format!("{}-{n}", self.id_prefix)
        } else {
            request.request_id
        };
        let index = &self.index.get().0;
        let hashes = BlockHasher::for_namespace(index.block_size(), &request.namespace)
            .seq_hashes(&request.tokens);
        let decision = self
            .core
            .get()
            .decide(
                index,
                &request_id,
                &hashes,
                request.tokens.len() as u64,
                now_ms,
                self.approximate_ttl,
            )
            .map_err(|e| (request_id.clone(), Refusal::from(e)))?;
        let num_blocks = hashes.len() as u64;
        let response = self
            .directory
            .read()
            .response(&request_id, &decision, num_blocks, request.explain)
            .encode_to_vec();
        Ok(Routed {
            response,
            request_id,
            decision,
            num_blocks,
        })
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
            if routed.num_blocks > 0 {
                stats
                    .overlap
                    .observe(overlap as f64 / routed.num_blocks as f64);
            }
        }
        if let Some(log) = &self.decisions {
            let at = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |t| t.as_secs_f64());
            log.lock().push(DecisionRecord {
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
    }
}

fn histogram_row(h: &Histogram) -> HistogramRow {
    (h.counts.clone(), h.sum)
}

#[pymethods]
impl PyWireRouter {
    #[new]
    #[pyo3(signature = (
        core, index, *, id_prefix, max_prompt_tokens, max_namespace_chars,
        max_request_id_chars, approximate_ttl_s, latency_buckets, overlap_buckets,
        log_decisions
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        core: Py<PyRoutingCore>,
        index: Py<PyPrefixIndex>,
        id_prefix: String,
        max_prompt_tokens: usize,
        max_namespace_chars: usize,
        max_request_id_chars: usize,
        approximate_ttl_s: f64,
        latency_buckets: Vec<f64>,
        overlap_buckets: Vec<f64>,
        log_decisions: bool,
    ) -> PyResult<Self> {
        for bounds in [&latency_buckets, &overlap_buckets] {
            if bounds.windows(2).any(|w| w[0] >= w[1]) {
                return Err(PyValueError::new_err("histogram buckets must increase"));
            }
        }
        Ok(PyWireRouter {
            core,
            index,
            limits: Limits {
                max_prompt_tokens,
                max_namespace_chars,
                max_request_id_chars,
            },
            approximate_ttl: (approximate_ttl_s > 0.0)
                .then(|| Duration::from_secs_f64(approximate_ttl_s)),
            id_prefix,
            next_id: AtomicU64::new(0),
            directory: RwLock::new(Directory::default()),
            stats: Mutex::new(RouteStats::new(latency_buckets, overlap_buckets)),
            decisions: log_decisions.then(|| Mutex::new(Vec::new())),
        })
    }

    /// Names a worker's role and address in responses.
    fn set_worker(&self, worker_id: u64, role: String, address: String) {
        self.directory
            .write()
            .set(WorkerId(worker_id), role, address);
    }

    fn remove_worker(&self, worker_id: u64) {
        self.directory.write().remove(WorkerId(worker_id));
    }

    /// Routes one serialized `RouteRequest` and books it; `now_s` is the
    /// policy's clock. Raises RouteRefused for a request it turns down.
    fn route<'py>(&self, py: Python<'py>, request: &[u8], now_s: f64) -> PyResult<RoutedRow<'py>> {
        let now_ms = (now_s * 1000.0).max(0.0) as u64;
        match py.detach(|| self.route_bytes(request, now_ms)) {
            Ok(r) => Ok((
                PyBytes::new(py, &r.response),
                r.request_id,
                r.decision.decode_worker.0,
                r.decision.prefill_worker.map(|w| w.0),
                r.decision.prefill_tokens,
                r.num_blocks,
            )),
            Err((request_id, refusal)) => Err(RouteRefused::new_err((
                refusal.code.name(),
                refusal.message,
                request_id,
            ))),
        }
    }

    /// The figures so far, for a metrics scrape.
    fn stats(&self) -> StatsRow {
        let stats = self.stats.lock();
        let mut decisions: Vec<_> = stats
            .decisions
            .iter()
            .map(|(&(worker, role), &count)| (worker.0, role.name(), count))
            .collect();
        decisions.sort_unstable();
        let mut errors: Vec<_> = stats.errors.iter().map(|(&c, &n)| (c, n)).collect();
        errors.sort_unstable();
        (
            decisions,
            errors,
            histogram_row(&stats.latency),
            histogram_row(&stats.overlap),
        )
    }

    /// The decision-log lines (JSON, each ending in a newline) for the
    /// decisions made since the last call; empty when the log is off.
    fn take_decision_lines(&self, py: Python<'_>) -> String {
        let Some(log) = &self.decisions else {
            return String::new();
        };
        let records = std::mem::take(&mut *log.lock());
        py.detach(|| wire::json_lines(&records))
    }
}

/// The prompt's token count from its `tokens` count and `tokens_u32le`
/// byte length; ValueError unless exactly one is set, whole and within
/// `max_tokens`.
#[pyfunction]
pub fn prompt_length(tokens: usize, packed_bytes: usize, max_tokens: usize) -> PyResult<usize> {
    wire::prompt_length(tokens, packed_bytes, max_tokens).map_err(PyValueError::new_err)
}

/// Raises ValueError unless the namespace is printable and at most
/// `max_chars` characters long.
#[pyfunction]
pub fn check_namespace(namespace: &str, max_chars: usize) -> PyResult<()> {
    wire::check_namespace(namespace, max_chars).map_err(PyValueError::new_err)
}
