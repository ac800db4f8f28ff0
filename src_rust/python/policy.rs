//! `RoutingCore` for Python: the policy's scoring and load book behind one
//! lock; every routing call releases the GIL while it scores.

use super::hashing::hasher;
use super::index::PyPrefixIndex;
use super::ints::{extract_hashes, Tokens};
use crate::hashing::BlockHasher;
use crate::ids::{SeqHash, WorkerId};
use crate::index::PrefixIndex;
use crate::policy::{
    Candidate, Coefficients, Decision, Load, Policy, PolicyConfig, Request, Role, RouteError,
    Selector,
};
use parking_lot::Mutex;
use pyo3::create_exception;
use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::time::Duration;

/// A prompt as the caller has it: raw tokens, or block hashes already made.
enum Prompt {
    Tokens(Tokens, BlockHasher),
    Hashes(Vec<SeqHash>),
}

create_exception!(
    kvrouter._core,
    NoWorkerAvailable,
    PyRuntimeError,
    "No healthy worker can take the request (none registered, all unhealthy, or none with room for the prompt)."
);

fn to_pyerr(error: RouteError) -> PyErr {
    let message = error.to_string();
    match error {
        RouteError::DuplicateRequest(_) => PyValueError::new_err(message),
        RouteError::UnknownWorker(_) => PyKeyError::new_err(message),
        RouteError::NoWorker { .. } => NoWorkerAvailable::new_err(message),
    }
}

/// (worker, device, host, disk, (queue_ms, prefill_ms, reload_ms, decode_ms,
///  transfer_ms, overflow_ms, congestion_ms), active_requests, overloaded)
type CandidateRow = (u64, u32, u32, u32, CostRow, u64, bool);
type CostRow = (f64, f64, f64, f64, f64, f64, f64);

fn row(c: &Candidate) -> CandidateRow {
    let k = &c.cost;
    (
        c.worker.0,
        c.overlap.device,
        c.overlap.host,
        c.overlap.disk,
        (
            k.queue_ms,
            k.prefill_ms,
            k.reload_ms,
            k.decode_ms,
            k.transfer_ms,
            k.overflow_ms,
            k.congestion_ms,
        ),
        c.active_requests,
        c.overloaded,
    )
}

/// (decode_worker, prefill_worker or None, predicted_ttft_ms, prefill_tokens,
///  num_blocks, reason, decode candidates, prefill candidates)
type DecisionRow = (
    u64,
    Option<u64>,
    f64,
    u64,
    u64,
    String,
    Vec<CandidateRow>,
    Vec<CandidateRow>,
);

#[pyclass(name = "RoutingCore", module = "kvrouter._core", frozen)]
pub struct PyRoutingCore {
    policy: Mutex<Policy>,
    block_size: u64,
}

/// Past this many predicted blocks in the index, routing adds no more.
const MAX_APPROXIMATE_BLOCKS: usize = 1_000_000;

impl PyRoutingCore {
    /// Looks the prompt's blocks up in `index`, scores every candidate and
    /// books the request on the winner(s). With an `approximate_ttl` the
    /// chosen workers are recorded as soon-to-hold the blocks when the
    /// prefilling worker last reported a backlog: only then do its KV events
    /// come late enough for a session's next turn to miss them. An idle pool
    /// pays nothing for predictions, and there are never more than
    /// `MAX_APPROXIMATE_BLOCKS`.
    pub(crate) fn decide(
        &self,
        index: &PrefixIndex,
        request_id: &str,
        hashes: &[SeqHash],
        num_tokens: u64,
        now_ms: u64,
        approximate_ttl: Option<Duration>,
    ) -> Result<Decision, RouteError> {
        let matched = if hashes.is_empty() {
            Vec::new()
        } else {
            index.find_matches(hashes, false).scores
        };
        let request = Request {
            num_tokens,
            num_blocks: hashes.len() as u64,
            block_size: self.block_size,
        };
        let (decision, backlogged) = {
            let mut policy = self.policy.lock();
            let decision = policy.route(request_id, request, &matched, now_ms)?;
            let prefilling = decision.prefill_worker.unwrap_or(decision.decode_worker);
            let backlogged = policy.reported_queue_tokens(prefilling) > 0;
            (decision, backlogged)
        };
        let predict = backlogged && index.num_approximate() < MAX_APPROXIMATE_BLOCKS;
        if let Some(ttl) = approximate_ttl.filter(|_| predict && !hashes.is_empty()) {
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
}

#[pymethods]
impl PyRoutingCore {
    #[new]
    #[pyo3(signature = (
        block_size, *, prefill_base_ms, prefill_ms_per_token, attention_ms_per_token2,
        decode_ms_per_block, host_reload_ms_per_block, disk_reload_ms_per_block,
        transfer_ms_per_block, max_batched_tokens, temperature, tie_tolerance,
        overload_factor, calibrate, calibration_alpha, seed, local_prefill_max_tokens,
        prefill_saturation_ms, stale_after_s, congestion_weight
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        block_size: u64,
        prefill_base_ms: f64,
        prefill_ms_per_token: f64,
        attention_ms_per_token2: f64,
        decode_ms_per_block: f64,
        host_reload_ms_per_block: f64,
        disk_reload_ms_per_block: f64,
        transfer_ms_per_block: f64,
        max_batched_tokens: f64,
        temperature: f64,
        tie_tolerance: f64,
        overload_factor: f64,
        calibrate: bool,
        calibration_alpha: f64,
        seed: u64,
        local_prefill_max_tokens: u64,
        prefill_saturation_ms: f64,
        stale_after_s: f64,
        congestion_weight: f64,
    ) -> PyResult<Self> {
        if block_size == 0 {
            return Err(PyValueError::new_err("block_size must be positive"));
        }
        let config = PolicyConfig {
            coefficients: Coefficients {
                prefill_base_ms,
                prefill_ms_per_token,
                attention_ms_per_token2,
                decode_ms_per_block,
                host_reload_ms_per_block,
                disk_reload_ms_per_block,
                transfer_ms_per_block,
                max_batched_tokens,
            },
            selector: Selector {
                temperature,
                tie_tolerance,
                overload_factor,
            },
            calibrate,
            calibration_alpha,
            seed,
            local_prefill_max_tokens,
            prefill_saturation_ms,
            stale_after_ms: (stale_after_s * 1000.0) as u64,
            congestion_weight,
        };
        Ok(PyRoutingCore {
            policy: Mutex::new(Policy::new(config)),
            block_size,
        })
    }

    fn upsert_worker(&self, worker_id: u64, role: &str, capacity_blocks: u64) -> PyResult<()> {
        let role = Role::parse(role).ok_or_else(|| {
            PyValueError::new_err(format!(
                "role must be prefill, decode or both, got {role:?}"
            ))
        })?;
        if capacity_blocks == 0 {
            return Err(PyValueError::new_err("capacity_blocks must be positive"));
        }
        self.policy
            .lock()
            .upsert_worker(WorkerId(worker_id), role, capacity_blocks);
        Ok(())
    }

    /// Returns the ids of the requests that were booked on the worker.
    fn remove_worker(&self, worker_id: u64) -> PyResult<Vec<String>> {
        self.policy
            .lock()
            .remove_worker(WorkerId(worker_id))
            .map_err(to_pyerr)
    }

    fn set_healthy(&self, worker_id: u64, healthy: bool) -> PyResult<()> {
        self.policy
            .lock()
            .set_healthy(WorkerId(worker_id), healthy)
            .map_err(to_pyerr)
    }

    fn report_load(
        &self,
        worker_id: u64,
        queued_prefill_tokens: u64,
        active_decode_blocks: u64,
        active_requests: u64,
    ) -> PyResult<()> {
        let load = Load {
            queued_prefill_tokens,
            active_decode_blocks,
            active_requests,
            capacity_blocks: 0,
        };
        self.policy
            .lock()
            .report_load(WorkerId(worker_id), load)
            .map_err(to_pyerr)
    }

    /// Looks the prompt up in `index`, scores every candidate and books the
    /// request on the winner(s), all in one call with the GIL released. The
    /// prompt is `tokens` (hashed here) or its block `hashes`; with a positive
    /// `approximate_ttl_s` the chosen workers are recorded as soon-to-hold
    /// the prompt's blocks.
    #[pyo3(signature = (
        index, request_id, tokens = None, *, hashes = None, num_tokens = None,
        namespace = "", now_s, approximate_ttl_s = 0.0
    ))]
    #[allow(clippy::too_many_arguments)]
    fn route(
        &self,
        py: Python<'_>,
        index: &PyPrefixIndex,
        request_id: &str,
        tokens: Option<&Bound<'_, PyAny>>,
        hashes: Option<&Bound<'_, PyAny>>,
        num_tokens: Option<u64>,
        namespace: &str,
        now_s: f64,
        approximate_ttl_s: f64,
    ) -> PyResult<DecisionRow> {
        let index = &index.0;
        let prompt = match (tokens, hashes) {
            (Some(tokens), None) => Prompt::Tokens(
                Tokens::extract(tokens)?,
                hasher(index.block_size(), namespace)?,
            ),
            (None, Some(hashes)) => {
                Prompt::Hashes(extract_hashes(hashes)?.into_iter().map(SeqHash).collect())
            }
            _ => {
                return Err(PyValueError::new_err(
                    "route needs exactly one of tokens or hashes",
                ))
            }
        };
        let now_ms = (now_s * 1000.0).max(0.0) as u64;
        let approximate_ttl =
            (approximate_ttl_s > 0.0).then(|| Duration::from_secs_f64(approximate_ttl_s));
        let (d, num_blocks) = py
            .detach(|| {
                let (hashes, prompt_tokens) = match &prompt {
                    Prompt::Tokens(tokens, hasher) => (
                        hasher.seq_hashes(tokens.as_slice()),
                        tokens.as_slice().len() as u64,
                    ),
                    Prompt::Hashes(hashes) => {
                        (hashes.clone(), hashes.len() as u64 * self.block_size)
                    }
                };
                let num_tokens = num_tokens.unwrap_or(prompt_tokens);
                self.decide(
                    index,
                    request_id,
                    &hashes,
                    num_tokens,
                    now_ms,
                    approximate_ttl,
                )
                .map(|decision| (decision, hashes.len() as u64))
            })
            .map_err(to_pyerr)?;
        Ok((
            d.decode_worker.0,
            d.prefill_worker.map(|w| w.0),
            d.predicted_ttft_ms,
            d.prefill_tokens,
            num_blocks,
            d.reason,
            d.decode_candidates.iter().map(row).collect(),
            d.prefill_candidates.iter().map(row).collect(),
        ))
    }

    /// False when the request is unknown or its prefill was already done.
    fn prefill_done(&self, request_id: &str) -> bool {
        self.policy.lock().prefill_done(request_id)
    }

    /// Frees the request's load; false when it was not booked.
    fn release(&self, request_id: &str) -> bool {
        self.policy.lock().release(request_id)
    }

    fn observe_prefill(&self, new_tokens: f64, cached_tokens: f64, ms: f64) {
        self.policy
            .lock()
            .observe_prefill(new_tokens, cached_tokens, ms);
    }

    fn observe_decode_step(&self, active_blocks: f64, ms: f64) {
        self.policy.lock().observe_decode_step(active_blocks, ms);
    }

    fn observe_transfer(&self, blocks: f64, ms: f64) {
        self.policy.lock().observe_transfer(blocks, ms);
    }

    /// (queued prefill tokens, active decode blocks, active requests) as scored.
    fn load(&self, worker_id: u64) -> PyResult<(u64, u64, u64)> {
        let policy = self.policy.lock();
        if !policy.workers().any(|(id, _)| id == WorkerId(worker_id)) {
            return Err(to_pyerr(RouteError::UnknownWorker(worker_id)));
        }
        let load = policy.load(WorkerId(worker_id));
        Ok((
            load.queued_prefill_tokens,
            load.active_decode_blocks,
            load.active_requests,
        ))
    }

    /// The cost coefficients in use (after calibration).
    fn coefficients<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.policy.lock().config.coefficients;
        let dict = PyDict::new(py);
        dict.set_item("prefill_base_ms", c.prefill_base_ms)?;
        dict.set_item("prefill_ms_per_token", c.prefill_ms_per_token)?;
        dict.set_item("attention_ms_per_token2", c.attention_ms_per_token2)?;
        dict.set_item("decode_ms_per_block", c.decode_ms_per_block)?;
        dict.set_item("host_reload_ms_per_block", c.host_reload_ms_per_block)?;
        dict.set_item("disk_reload_ms_per_block", c.disk_reload_ms_per_block)?;
        dict.set_item("transfer_ms_per_block", c.transfer_ms_per_block)?;
        dict.set_item("max_batched_tokens", c.max_batched_tokens)?;
        Ok(dict)
    }

    /// Requests currently booked.
    fn __len__(&self) -> usize {
        self.policy.lock().book().len()
    }
}
