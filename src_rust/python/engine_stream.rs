//! An engine's streamed completion read into token ids
//! (`wire::CompletionStream`), a prompt's ids as JSON for an engine's
//! request body, and a client's prompt of ids read from its JSON.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::ints::{contiguous_slice, Tokens};
use crate::wire::{self, CompletionStream, Finish};

/// One engine's streamed `/v1/completions` answer, fed its body's bytes as
/// they arrive.
#[pyclass(name = "CompletionStream", module = "kvrouter._core")]
pub struct PyCompletionStream {
    inner: CompletionStream,
}

#[pymethods]
impl PyCompletionStream {
    #[new]
    fn new(limit: usize) -> Self {
        Self {
            inner: CompletionStream::new(limit),
        }
    }

    /// (token ids, finish reason, ended) of what `data` added: the reason
    /// is "stop", "length" or None; `ended` once a finish or `[DONE]` has
    /// come. ValueError, with the reason, when the stream cannot be read
    /// on (an error event, a bad event, an event past the limit).
    fn feed(&mut self, data: &[u8]) -> PyResult<(Vec<u32>, Option<&'static str>, bool)> {
        let piece = self
            .inner
            .feed(data)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let finish = piece.finish.map(|f| match f {
            Finish::Stop => "stop",
            Finish::Length => "length",
        });
        Ok((piece.tokens, finish, piece.ended))
    }

    #[getter]
    fn ended(&self) -> bool {
        self.inner.ended()
    }
}

/// `tokens` (a list, array('I'), numpy array or bytes, as everywhere) as a
/// JSON array of ints.
#[pyfunction]
pub fn token_ids_json<'py>(
    py: Python<'py>,
    tokens: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let tokens = Tokens::extract(tokens)?;
    let tokens = tokens.as_slice();
    PyBytes::new_with(py, wire::token_ids_json_len(tokens), |out| {
        wire::write_token_ids_json(tokens, out);
        Ok(())
    })
}

/// The token ids a JSON array of integers in 0..2³² holds, as little-endian
/// u32 bytes (for `array('I').frombytes`); None for any other JSON. `json`
/// is any contiguous byte buffer (bytes, `msgspec.Raw`).
#[pyfunction]
pub fn token_ids_from_json<'py>(
    py: Python<'py>,
    json: PyBuffer<u8>,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    if !json.is_c_contiguous() {
        return Err(PyValueError::new_err("json must be a contiguous buffer"));
    }
    let Some(tokens) = wire::read_token_ids_json(contiguous_slice(&json)) else {
        return Ok(None);
    };
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    Ok(Some(PyBytes::new(py, &bytes)))
}
