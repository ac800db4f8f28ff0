//! One `PublishRequest` for Python: decoded with the GIL released into a
//! hello or a batch whose events stay in Rust until the index applies them
//! (`PrefixIndex.apply_decoded`).

use crate::wire::{decode_publish, DecodedBatch, Publish};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The first message of a Publish stream.
#[pyclass(name = "PublishHello", module = "kvrouter._core", frozen, get_all)]
pub struct PyPublishHello {
    worker_id: u64,
    next_seq: u64,
    block_size: u32,
    registration_token: u64,
}

/// A decoded event batch; its events are the index's, checked already.
#[pyclass(name = "DecodedBatch", module = "kvrouter._core", frozen)]
pub struct PyDecodedBatch(pub(crate) DecodedBatch);

#[pymethods]
impl PyDecodedBatch {
    #[getter]
    fn seq(&self) -> u64 {
        self.0.seq
    }

    /// A full dump that replaces what the router knows of the worker.
    #[getter]
    fn resync(&self) -> bool {
        self.0.resync
    }

    #[getter]
    fn emitted_at(&self) -> f64 {
        self.0.emitted_at
    }

    /// Blocks stored by the batch's events.
    #[getter]
    fn blocks(&self) -> usize {
        self.0.blocks
    }

    fn __len__(&self) -> usize {
        self.0.events.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "DecodedBatch(seq={}, events={}, blocks={}, resync={})",
            self.0.seq,
            self.0.events.len(),
            self.0.blocks,
            self.0.resync
        )
    }
}

/// Decodes a serialized `PublishRequest`: a `PublishHello`, or a batch
/// checked for an index of `block_size` and at most `max_events` events.
/// ValueError, naming the batch and event, for bytes that are not one.
#[pyfunction]
pub fn decode_publish_request(
    py: Python<'_>,
    data: &[u8],
    block_size: usize,
    max_events: usize,
) -> PyResult<Py<PyAny>> {
    match py.detach(|| decode_publish(data, block_size, max_events)) {
        Ok(Publish::Hello(hello)) => Ok(Py::new(
            py,
            PyPublishHello {
                worker_id: hello.worker_id,
                next_seq: hello.next_seq,
                block_size: hello.block_size,
                registration_token: hello.registration_token,
            },
        )?
        .into_any()),
        Ok(Publish::Batch(batch)) => Ok(Py::new(py, PyDecodedBatch(batch))?.into_any()),
        Err(message) => Err(PyValueError::new_err(message)),
    }
}
