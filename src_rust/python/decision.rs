//! A routing decision for Python: frozen views of the core's `Routed`,
//! shared, so the candidates become Python objects only when read.

use crate::policy::{Booking, Candidate};
use crate::routing::Routed;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;

/// One worker as the policy scored it for one request.
#[pyclass(name = "Candidate", module = "kvrouter._core", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct PyCandidate(Candidate);

#[pymethods]
impl PyCandidate {
    #[getter]
    fn worker_id(&self) -> u64 {
        self.0.worker.0
    }
    /// Blocks of the prompt this worker holds on its device.
    #[getter]
    fn overlap_device(&self) -> u32 {
        self.0.overlap.device
    }
    #[getter]
    fn overlap_host(&self) -> u32 {
        self.0.overlap.host
    }
    #[getter]
    fn overlap_disk(&self) -> u32 {
        self.0.overlap.disk
    }
    /// Blocks of the prompt this worker holds, all tiers.
    #[getter]
    fn overlap(&self) -> u32 {
        self.0.overlap.total()
    }
    /// What choosing it costs (ms): its TTFT plus the latency it adds to
    /// the requests queued behind it and decoding beside it.
    #[getter]
    fn cost_ms(&self) -> f64 {
        self.0.cost.total()
    }
    #[getter]
    fn queue_ms(&self) -> f64 {
        self.0.cost.queue_ms
    }
    #[getter]
    fn prefill_ms(&self) -> f64 {
        self.0.cost.prefill_ms
    }
    #[getter]
    fn reload_ms(&self) -> f64 {
        self.0.cost.reload_ms
    }
    #[getter]
    fn decode_ms(&self) -> f64 {
        self.0.cost.decode_ms
    }
    #[getter]
    fn transfer_ms(&self) -> f64 {
        self.0.cost.transfer_ms
    }
    /// Blocks the request would push out of a full cache, priced as prefill.
    #[getter]
    fn overflow_ms(&self) -> f64 {
        self.0.cost.overflow_ms
    }
    /// The delay its extra prefill passes on to the requests queued behind it.
    #[getter]
    fn congestion_ms(&self) -> f64 {
        self.0.cost.congestion_ms
    }
    /// The wait its prefill imposes on the streams decoding there.
    #[getter]
    fn stall_ms(&self) -> f64 {
        self.0.cost.stall_ms
    }
    /// The slowdown of the decode steps it shares with those streams.
    #[getter]
    fn slowdown_ms(&self) -> f64 {
        self.0.cost.slowdown_ms
    }
    /// The recomputation its new blocks push onto later requests by
    /// evicting cached blocks they would have hit.
    #[getter]
    fn pollution_ms(&self) -> f64 {
        self.0.cost.pollution_ms
    }
    /// Its queue wait again, in proportion to how far its TTFT exceeds the
    /// typical one.
    #[getter]
    fn tail_ms(&self) -> f64 {
        self.0.cost.tail_ms
    }
    /// Its own predicted time to first token.
    #[getter]
    fn ttft_ms(&self) -> f64 {
        self.0.cost.ttft_ms()
    }
    #[getter]
    fn active_requests(&self) -> u64 {
        self.0.active_requests
    }
    /// Skipped because it carried more than its share of the pool's requests.
    #[getter]
    fn overloaded(&self) -> bool {
        self.0.overloaded
    }

    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = &self.0;
        let d = PyDict::new(py);
        d.set_item("worker_id", c.worker.0)?;
        d.set_item("overlap_device", c.overlap.device)?;
        d.set_item("overlap_host", c.overlap.host)?;
        d.set_item("overlap_disk", c.overlap.disk)?;
        d.set_item("overlap", c.overlap.total())?;
        d.set_item("cost_ms", c.cost.total())?;
        d.set_item("queue_ms", c.cost.queue_ms)?;
        d.set_item("prefill_ms", c.cost.prefill_ms)?;
        d.set_item("reload_ms", c.cost.reload_ms)?;
        d.set_item("decode_ms", c.cost.decode_ms)?;
        d.set_item("transfer_ms", c.cost.transfer_ms)?;
        d.set_item("overflow_ms", c.cost.overflow_ms)?;
        d.set_item("congestion_ms", c.cost.congestion_ms)?;
        d.set_item("stall_ms", c.cost.stall_ms)?;
        d.set_item("slowdown_ms", c.cost.slowdown_ms)?;
        d.set_item("pollution_ms", c.cost.pollution_ms)?;
        d.set_item("tail_ms", c.cost.tail_ms)?;
        d.set_item("active_requests", c.active_requests)?;
        d.set_item("overloaded", c.overloaded)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "Candidate(worker_id={}, overlap={}, cost_ms={:.3})",
            self.0.worker.0,
            self.0.overlap.total(),
            self.0.cost.total()
        )
    }
}

fn candidates(list: &[Candidate]) -> Vec<PyCandidate> {
    list.iter().cloned().map(PyCandidate).collect()
}

fn find(list: &[Candidate], worker_id: Option<u64>) -> Option<PyCandidate> {
    list.iter()
        .find(|c| Some(c.worker.0) == worker_id)
        .cloned()
        .map(PyCandidate)
}

/// The candidates with their overlaps and predicted costs, and why the
/// winner won. In a split, decode candidates' costs include the prefill.
#[pyclass(name = "Explanation", module = "kvrouter._core", frozen)]
pub struct PyExplanation(Arc<Routed>);

#[pymethods]
impl PyExplanation {
    #[getter]
    fn reason(&self) -> &str {
        &self.0.decision.reason
    }
    #[getter]
    fn decode_candidates(&self) -> Vec<PyCandidate> {
        candidates(&self.0.decision.decode_candidates)
    }
    #[getter]
    fn prefill_candidates(&self) -> Vec<PyCandidate> {
        candidates(&self.0.decision.prefill_candidates)
    }
    /// The decode-side candidate for one worker, or None.
    fn decode_candidate(&self, worker_id: Option<u64>) -> Option<PyCandidate> {
        find(&self.0.decision.decode_candidates, worker_id)
    }
    fn prefill_candidate(&self, worker_id: Option<u64>) -> Option<PyCandidate> {
        find(&self.0.decision.prefill_candidates, worker_id)
    }

    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("reason", self.reason())?;
        let list = |cs: Vec<PyCandidate>| -> PyResult<Vec<Bound<'py, PyDict>>> {
            cs.iter().map(|c| c.to_dict(py)).collect()
        };
        d.set_item("decode_candidates", list(self.decode_candidates())?)?;
        d.set_item("prefill_candidates", list(self.prefill_candidates())?)?;
        Ok(d)
    }
}

/// Where a request goes. `prefill_worker` is None when the decode worker
/// prefills the prompt itself (aggregated worker, or local prefill).
#[pyclass(name = "Decision", module = "kvrouter._core", frozen)]
pub struct PyDecision(Arc<Routed>);

impl PyDecision {
    pub(crate) fn new(routed: Routed) -> Self {
        PyDecision(Arc::new(routed))
    }
}

#[pymethods]
impl PyDecision {
    #[getter]
    fn request_id(&self) -> &str {
        &self.0.request_id
    }
    #[getter]
    fn decode_worker(&self) -> u64 {
        self.0.decision.decode_worker.0
    }
    #[getter]
    fn prefill_worker(&self) -> Option<u64> {
        self.0.decision.prefill_worker.map(|w| w.0)
    }
    #[getter]
    fn disaggregated(&self) -> bool {
        self.0.decision.prefill_worker.is_some()
    }
    /// Full blocks of the prompt.
    #[getter]
    fn num_blocks(&self) -> u64 {
        self.0.num_blocks
    }
    /// Tokens the prefilling worker computes (the uncached part there).
    #[getter]
    fn prefill_tokens(&self) -> u64 {
        self.0.decision.prefill_tokens
    }
    #[getter]
    fn predicted_ttft_ms(&self) -> f64 {
        self.0.decision.predicted_ttft_ms
    }
    #[getter]
    fn explanation(&self) -> PyExplanation {
        PyExplanation(Arc::clone(&self.0))
    }

    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("request_id", self.request_id())?;
        d.set_item("prefill_worker", self.prefill_worker())?;
        d.set_item("decode_worker", self.decode_worker())?;
        d.set_item("disaggregated", self.disaggregated())?;
        d.set_item("num_blocks", self.num_blocks())?;
        d.set_item("prefill_tokens", self.prefill_tokens())?;
        d.set_item("predicted_ttft_ms", self.predicted_ttft_ms())?;
        d.set_item("explanation", self.explanation().to_dict(py)?)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "Decision(request_id={:?}, decode_worker={}, prefill_worker={:?})",
            self.0.request_id,
            self.decode_worker(),
            self.prefill_worker()
        )
    }
}

/// One request's load as a router booked it: shared with peer replicas.
#[pyclass(name = "Booking", module = "kvrouter._core", frozen, eq, get_all)]
#[derive(Clone, PartialEq)]
pub struct PyBooking {
    /// Where the prefill tokens are charged (the decode worker when local).
    pub prefill_worker: u64,
    pub decode_worker: u64,
    pub prefill_tokens: u64,
    pub decode_blocks: u64,
    /// False once the prefill is done.
    pub prefill_open: bool,
}

impl From<&Booking> for PyBooking {
    fn from(b: &Booking) -> Self {
        PyBooking {
            prefill_worker: b.prefill_worker.0,
            decode_worker: b.decode_worker.0,
            prefill_tokens: b.prefill_tokens,
            decode_blocks: b.decode_blocks,
            prefill_open: b.prefill_open,
        }
    }
}

impl PyBooking {
    pub(crate) fn to_core(&self, at_ms: u64) -> Booking {
        Booking {
            prefill_worker: crate::ids::WorkerId(self.prefill_worker),
            decode_worker: crate::ids::WorkerId(self.decode_worker),
            prefill_tokens: self.prefill_tokens,
            decode_blocks: self.decode_blocks,
            prefill_open: self.prefill_open,
            at_ms,
        }
    }
}

#[pymethods]
impl PyBooking {
    #[new]
    #[pyo3(signature = (prefill_worker, decode_worker, prefill_tokens, decode_blocks, prefill_open = true))]
    fn new(
        prefill_worker: u64,
        decode_worker: u64,
        prefill_tokens: u64,
        decode_blocks: u64,
        prefill_open: bool,
    ) -> Self {
        PyBooking {
            prefill_worker,
            decode_worker,
            prefill_tokens,
            decode_blocks,
            prefill_open,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Booking(prefill_worker={}, decode_worker={}, prefill_tokens={}, decode_blocks={}, prefill_open={})",
            self.prefill_worker, self.decode_worker, self.prefill_tokens, self.decode_blocks,
            if self.prefill_open { "True" } else { "False" }
        )
    }
}
