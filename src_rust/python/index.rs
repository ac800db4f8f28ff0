//! `PrefixIndex` for Python: every call releases the GIL for the index work.

use super::events::EventObjects;
use super::hashing::hasher;
use super::ints::{extract_hashes, Tokens};
use super::publish::PyDecodedBatch;
use crate::hashing::DEFAULT_BLOCK_SIZE;
use crate::ids::{SeqHash, WorkerId};
use crate::index::{
    ApplyOutcome, EventBatch, IndexConfig, IndexError, OverlapScores, PrefixIndex, SeqStatus,
    SnapshotMarks,
};
use pyo3::exceptions::{PyKeyError, PyOverflowError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::time::Duration;

pub fn to_pyerr(error: IndexError) -> PyErr {
    let message = error.to_string();
    match error {
        IndexError::UnknownWorker(_)
        | IndexError::UnknownBlock { .. }
        | IndexError::UnknownParent { .. } => PyKeyError::new_err(message),
        IndexError::TooManyWorkers(_) => PyOverflowError::new_err(message),
        IndexError::MalformedEvent { .. } | IndexError::BadSnapshot(_) => {
            PyValueError::new_err(message)
        }
    }
}

/// What applying one event batch did.
#[pyclass(name = "ApplyOutcome", module = "kvrouter._core", frozen, get_all)]
pub struct PyApplyOutcome {
    /// "applied", "duplicate" (already seen; nothing changed), "gap" (the batch
    /// skips ahead; nothing applied; resync the worker) or "rejected".
    status: &'static str,
    /// For "gap": the batch number the worker should have sent.
    expected_seq: Option<u64>,
    blocks_stored: usize,
    blocks_removed: usize,
    unknown_removals: usize,
    /// For "rejected": why.
    error: Option<String>,
}

#[pymethods]
impl PyApplyOutcome {
    fn __repr__(&self) -> String {
        format!(
            "ApplyOutcome(status={:?}, expected_seq={:?}, blocks_stored={}, blocks_removed={}, unknown_removals={}, error={:?})",
            self.status, self.expected_seq, self.blocks_stored, self.blocks_removed, self.unknown_removals, self.error
        )
    }
}

impl From<ApplyOutcome> for PyApplyOutcome {
    fn from(outcome: ApplyOutcome) -> Self {
        let (status, expected_seq) = match outcome.status {
            SeqStatus::Applied => ("applied", None),
            SeqStatus::Duplicate => ("duplicate", None),
            SeqStatus::Gap { expected } => ("gap", Some(expected)),
        };
        PyApplyOutcome {
            status,
            expected_seq,
            blocks_stored: outcome.blocks_stored,
            blocks_removed: outcome.blocks_removed,
            unknown_removals: outcome.unknown_removals,
            error: None,
        }
    }
}

impl PyApplyOutcome {
    fn rejected(error: String) -> Self {
        PyApplyOutcome {
            status: "rejected",
            expected_seq: None,
            blocks_stored: 0,
            blocks_removed: 0,
            unknown_removals: 0,
            error: Some(error),
        }
    }
}

/// Per worker, how many leading blocks of the query it holds, by tier.
#[pyclass(name = "OverlapScores", module = "kvrouter._core", frozen)]
pub struct PyOverlapScores(OverlapScores);

#[pymethods]
impl PyOverlapScores {
    /// {worker_id: matched blocks}
    #[getter]
    fn scores<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (worker, depths) in &self.0.scores {
            dict.set_item(worker.0, depths.total())?;
        }
        Ok(dict)
    }

    /// {worker_id: (device, host, disk)} matched blocks per tier.
    #[getter]
    fn tiers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (worker, d) in &self.0.scores {
            dict.set_item(worker.0, (d.device, d.host, d.disk))?;
        }
        Ok(dict)
    }

    /// Matched blocks of one worker (0 when it holds none).
    fn depth(&self, worker_id: u64) -> u32 {
        self.0.depth(WorkerId(worker_id))
    }

    fn __len__(&self) -> usize {
        self.0.scores.len()
    }

    fn __repr__(&self) -> String {
        let shown: Vec<String> = self
            .0
            .scores
            .iter()
            .map(|(w, d)| format!("{}: {}", w.0, d.total()))
            .collect();
        format!("OverlapScores({{{}}})", shown.join(", "))
    }
}

fn seq_hashes(obj: &Bound<'_, PyAny>) -> PyResult<Vec<SeqHash>> {
    Ok(extract_hashes(obj)?.into_iter().map(SeqHash).collect())
}

/// Which workers hold which cached prefixes. Thread-safe: lookups run in
/// parallel; writes are batched per call.
#[pyclass(name = "PrefixIndex", module = "kvrouter._core", frozen)]
pub struct PyPrefixIndex(pub(crate) PrefixIndex);

#[pymethods]
impl PyPrefixIndex {
    #[new]
    #[pyo3(signature = (block_size = DEFAULT_BLOCK_SIZE, max_blocks = None, *, manual_clock = false))]
    fn new(block_size: usize, max_blocks: Option<usize>, manual_clock: bool) -> PyResult<Self> {
        if block_size == 0 {
            return Err(PyValueError::new_err("block_size must be positive"));
        }
        if max_blocks == Some(0) {
            return Err(PyValueError::new_err(
                "max_blocks must be positive (or None for unbounded)",
            ));
        }
        let config = IndexConfig {
            block_size,
            max_nodes: max_blocks,
        };
        Ok(PyPrefixIndex(if manual_clock {
            PrefixIndex::with_manual_clock(config)
        } else {
            PrefixIndex::new(config)
        }))
    }

    #[getter]
    fn block_size(&self) -> usize {
        self.0.block_size()
    }

    /// Sizes the index's tables for workers that can hold `capacity_blocks`
    /// blocks together (at most `max_blocks` and 2^24): one home per block,
    /// kept until the next call (fewer shrinks them), so that applying their
    /// events does not double a table, one stalling step, until more than
    /// 7/8 of those blocks are distinct. The tables are made before the
    /// index is locked and swapped in under the lock, so lookups go on
    /// meanwhile. A router sizes its index for its registered workers, in
    /// the background.
    fn reserve(&self, py: Python<'_>, capacity_blocks: usize) {
        py.detach(|| self.0.reserve(capacity_blocks));
    }

    /// Waits until the index is sized as last asked in the background (a
    /// router asks at every registration and removal), and an engine's
    /// name table, made for the batch of its first ids, has its reserved
    /// size.
    fn wait_sized(&self, py: Python<'_>) {
        py.detach(|| self.0.wait_sized());
    }

    /// Applies batch `seq` of `worker_id`'s events. A malformed event raises
    /// ValueError; with `strict`, removing, marking or extending a block the worker
    /// does not hold raises KeyError. Either way nothing is applied.
    #[pyo3(signature = (worker_id, seq, events, *, strict = false))]
    fn apply(
        &self,
        py: Python<'_>,
        worker_id: u64,
        seq: u64,
        events: &Bound<'_, PyAny>,
        strict: bool,
    ) -> PyResult<PyApplyOutcome> {
        let objects = EventObjects::collect(events)?;
        let batch = EventBatch {
            worker: WorkerId(worker_id),
            seq,
            events: objects.events(self.0.block_size())?,
        };
        py.detach(|| self.0.apply(&batch, strict))
            .map(Into::into)
            .map_err(to_pyerr)
    }

    /// Applies `(worker_id, seq, events)` batches under one lock; a bad batch
    /// comes back "rejected" without stopping the rest.
    #[pyo3(signature = (batches, *, strict = false))]
    fn apply_many(
        &self,
        py: Python<'_>,
        batches: Vec<(u64, u64, Bound<'_, PyAny>)>,
        strict: bool,
    ) -> PyResult<Vec<PyApplyOutcome>> {
        let objects = batches
            .iter()
            .map(|(_, _, events)| EventObjects::collect(events))
            .collect::<PyResult<Vec<_>>>()?;
        let mut valid = Vec::with_capacity(batches.len());
        let mut extraction: Vec<Option<String>> = Vec::with_capacity(batches.len());
        for ((worker, seq, _), objects) in batches.iter().zip(&objects) {
            match objects.events(self.0.block_size()) {
                Ok(events) => {
                    valid.push(EventBatch {
                        worker: WorkerId(*worker),
                        seq: *seq,
                        events,
                    });
                    extraction.push(None);
                }
                Err(error) => extraction.push(Some(error.to_string())),
            }
        }
        let mut results = py.detach(|| self.0.apply_many(&valid, strict)).into_iter();
        Ok(extraction
            .into_iter()
            .map(|failure| match failure {
                Some(reason) => PyApplyOutcome::rejected(reason),
                None => match results.next().expect("one result per valid batch") {
                    Ok(outcome) => outcome.into(),
                    Err(error) => PyApplyOutcome::rejected(error.to_string()),
                },
            })
            .collect())
    }

    /// Replaces all that is known of the worker with `events` (a full dump of
    /// its cache) and continues its stream after `seq`.
    fn resync(
        &self,
        py: Python<'_>,
        worker_id: u64,
        seq: u64,
        events: &Bound<'_, PyAny>,
    ) -> PyResult<PyApplyOutcome> {
        let objects = EventObjects::collect(events)?;
        let batch = EventBatch {
            worker: WorkerId(worker_id),
            seq,
            events: objects.events(self.0.block_size())?,
        };
        py.detach(|| self.0.resync(&batch))
            .map(Into::into)
            .map_err(to_pyerr)
    }

    /// Applies a batch from `decode_publish_request` (a resync dump when it
    /// says so) a slice at a time, so lookups on other threads wait at most
    /// about a millisecond for it however big it is.
    fn apply_decoded(
        &self,
        py: Python<'_>,
        worker_id: u64,
        batch: &PyDecodedBatch,
    ) -> PyResult<PyApplyOutcome> {
        let decoded = &batch.0;
        let batch = EventBatch {
            worker: WorkerId(worker_id),
            seq: decoded.seq,
            events: decoded.events.iter().collect::<Vec<_>>(),
        };
        py.detach(|| self.0.apply_in_slices(&batch, decoded.resync))
            .map(Into::into)
            .map_err(to_pyerr)
    }

    /// Drops a worker and its blocks; returns how many blocks it held.
    fn remove_worker(&self, py: Python<'_>, worker_id: u64) -> PyResult<usize> {
        py.detach(|| self.0.remove_worker(WorkerId(worker_id)))
            .map_err(to_pyerr)
    }

    /// Per worker, the cached prefix length of a sequence given by its
    /// sequence hashes. `early_exit` stops once one worker is left matching.
    #[pyo3(signature = (seq_hashes, *, early_exit = false))]
    fn find_matches(
        &self,
        py: Python<'_>,
        seq_hashes: &Bound<'_, PyAny>,
        early_exit: bool,
    ) -> PyResult<PyOverlapScores> {
        let hashes = self::seq_hashes(seq_hashes)?;
        Ok(PyOverlapScores(
            py.detach(|| self.0.find_matches(&hashes, early_exit)),
        ))
    }

    /// `find_matches` for raw tokens: hashing and lookup in one GIL-free call.
    #[pyo3(signature = (tokens, *, namespace = "", early_exit = false))]
    fn find_matches_for_tokens(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        namespace: &str,
        early_exit: bool,
    ) -> PyResult<PyOverlapScores> {
        let hasher = hasher(self.0.block_size(), namespace)?;
        let tokens = Tokens::extract(tokens)?;
        Ok(PyOverlapScores(py.detach(|| {
            let hashes = hasher.seq_hashes(tokens.as_slice());
            self.0.find_matches(&hashes, early_exit)
        })))
    }

    /// Predicts that `worker_id` will hold these blocks for `ttl_s` seconds,
    /// or until its events confirm or remove them.
    fn insert_approximate(
        &self,
        py: Python<'_>,
        worker_id: u64,
        seq_hashes: &Bound<'_, PyAny>,
        ttl_s: f64,
    ) -> PyResult<()> {
        if !(ttl_s.is_finite() && ttl_s > 0.0) {
            return Err(PyValueError::new_err(
                "ttl_s must be a positive number of seconds",
            ));
        }
        let hashes = self::seq_hashes(seq_hashes)?;
        py.detach(|| {
            self.0
                .insert_approximate(WorkerId(worker_id), &hashes, Duration::from_secs_f64(ttl_s))
        })
        .map_err(to_pyerr)
    }

    /// Sets the time approximate entries expire by, on an index made with
    /// `manual_clock=True`; it never moves backward.
    fn set_time(&self, now_s: f64) -> PyResult<()> {
        if !(now_s.is_finite() && now_s >= 0.0) {
            return Err(PyValueError::new_err("now_s must be a non-negative number"));
        }
        if self.0.set_time_ms((now_s * 1000.0) as u64) {
            Ok(())
        } else {
            Err(PyValueError::new_err(
                "this index follows the wall clock; make it with manual_clock=True",
            ))
        }
    }

    /// {"blocks", "workers", "approximate", "pruned_total", "table_bytes"}
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.0.stats();
        let dict = PyDict::new(py);
        dict.set_item("blocks", stats.blocks)?;
        dict.set_item("workers", stats.workers)?;
        dict.set_item("approximate", stats.approximate)?;
        dict.set_item("pruned_total", stats.pruned_total)?;
        dict.set_item("table_bytes", stats.table_bytes)?;
        Ok(dict)
    }

    /// {worker_id: (confirmed blocks, next expected batch number)}
    fn workers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for info in self.0.workers() {
            let next_seq = info.last_seq.map_or(0, |s| s + 1);
            dict.set_item(info.worker.0, (info.blocks, next_seq))?;
        }
        Ok(dict)
    }

    /// The confirmed index and every worker's stream position, as bytes
    /// sealed with a checksum, with the owner's two counters.
    #[pyo3(signature = (*, stream_position = 0, next_worker_id = 0))]
    fn snapshot<'py>(
        &self,
        py: Python<'py>,
        stream_position: u64,
        next_worker_id: u64,
    ) -> Bound<'py, PyBytes> {
        let marks = SnapshotMarks {
            stream_position,
            next_worker_id,
        };
        let bytes = py.detach(|| self.0.snapshot(marks));
        PyBytes::new(py, &bytes)
    }

    /// An index loaded from `snapshot()` bytes; ValueError, naming what is
    /// wrong, for bytes that are truncated, corrupt or of another format.
    #[staticmethod]
    fn restore(py: Python<'_>, data: &[u8]) -> PyResult<PyPrefixIndex> {
        Self::restore_marked(py, data).map(|(index, _)| index)
    }

    /// `restore`, with the counters stored with the snapshot:
    /// (index, {"stream_position", "next_worker_id"}).
    #[staticmethod]
    fn restore_marked<'py>(
        py: Python<'py>,
        data: &[u8],
    ) -> PyResult<(PyPrefixIndex, Bound<'py, PyDict>)> {
        let (index, marks) = py.detach(|| PrefixIndex::restore(data)).map_err(to_pyerr)?;
        let dict = PyDict::new(py);
        dict.set_item("stream_position", marks.stream_position)?;
        dict.set_item("next_worker_id", marks.next_worker_id)?;
        Ok((PyPrefixIndex(index), dict))
    }

    fn __repr__(&self) -> String {
        let stats = self.0.stats();
        format!(
            "PrefixIndex(block_size={}, blocks={}, workers={})",
            self.0.block_size(),
            stats.blocks,
            stats.workers
        )
    }
}
