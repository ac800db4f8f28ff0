//! An engine's streamed completion read into token ids
//! (`wire::CompletionStream`), an engine's request body with a prompt's
//! ids as JSON, and a client's prompt of ids read from its JSON.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyNotImplementedError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::ints::{contiguous_slice, Tokens};
use crate::wire::{self, CompletionStream, Finish};

/// What `feed` returns: tokens, finish reason, ended, log probabilities.
type FedPiece = (
    Vec<u32>,
    Option<&'static str>,
    bool,
    Vec<(f32, Vec<(u32, f32)>)>,
);

/// One engine's streamed `/v1/completions` answer, fed its body's bytes as
/// they arrive.
#[pyclass(name = "CompletionStream", module = "kvrouter._core")]
pub struct PyCompletionStream {
    inner: CompletionStream,
}

#[pymethods]
impl PyCompletionStream {
    /// `logprobs`: read each token's log probability, with this many most
    /// likely tokens'; None: none.
    #[new]
    #[pyo3(signature = (limit, logprobs=None))]
    fn new(limit: usize, logprobs: Option<usize>) -> Self {
        let inner = CompletionStream::new(limit);
        Self {
            inner: match logprobs {
                Some(top) => inner.with_logprobs(top),
                None => inner,
            },
        }
    }

    /// (token ids, finish reason, ended, log probabilities) of what `data`
    /// added: the reason is "stop", "length" or None; `ended` once a finish
    /// or `[DONE]` has come; when asked for, one (log probability, [(token
    /// id, log probability)] most likely first) per token, else empty.
    /// ValueError, with the reason, when the stream cannot be read on (an
    /// error event, a bad event, an event past the limit);
    /// NotImplementedError when its tokens come without the log
    /// probabilities asked for, or without naming their ids.
    fn feed(&mut self, data: &[u8]) -> PyResult<FedPiece> {
        let piece = self.inner.feed(data).map_err(|e| {
            if e.is_unsupported() {
                PyNotImplementedError::new_err(e.to_string())
            } else {
                PyValueError::new_err(e.to_string())
            }
        })?;
        let finish = piece.finish.map(|f| match f {
            Finish::Stop => "stop",
            Finish::Length => "length",
        });
        let logprobs = piece
            .logprobs
            .into_iter()
            .map(|found| (found.logprob, found.top))
            .collect();
        Ok((piece.tokens, finish, piece.ended, logprobs))
    }

    #[getter]
    fn ended(&self) -> bool {
        self.inner.ended()
    }
}

/// An engine's request body: a JSON object whose first field, `prompt`, is
/// `tokens` (a list, array('I'), numpy array or bytes, as everywhere) as an
/// array of ints, followed by the fields of `fields`, a JSON object's bytes
/// (as msgspec writes it). A long prompt's ids are most of the body, so the
/// body is written once, straight into the bytes returned.
#[pyfunction]
pub fn prompt_body_json<'py>(
    py: Python<'py>,
    tokens: &Bound<'py, PyAny>,
    fields: &[u8],
) -> PyResult<Bound<'py, PyBytes>> {
    let inner = match fields {
        [b'{', inner @ .., b'}'] => inner,
        _ => {
            return Err(PyValueError::new_err(
                "fields must be a JSON object's bytes",
            ))
        }
    };
    let tokens = Tokens::extract(tokens)?;
    let tokens = tokens.as_slice();
    let ids = wire::token_ids_json_len(tokens);
    let comma = usize::from(!inner.is_empty());
    let len = PROMPT_KEY.len() + ids + comma + inner.len() + 1;
    let body = uninitialized_bytes(py, len)?;
    // SAFETY: `body` is a new bytes object of `len` bytes that nothing else
    // refers to yet; every byte of it is written below before it is returned.
    let out = unsafe {
        std::slice::from_raw_parts_mut(ffi::PyBytes_AsString(body.as_ptr()).cast::<u8>(), len)
    };
    let (key, rest) = out.split_at_mut(PROMPT_KEY.len());
    key.copy_from_slice(PROMPT_KEY);
    let (array, rest) = rest.split_at_mut(ids);
    wire::write_token_ids_json(tokens, array);
    let (separator, rest) = rest.split_at_mut(comma);
    separator.fill(b',');
    let (others, close) = rest.split_at_mut(inner.len());
    others.copy_from_slice(inner);
    close[0] = b'}';
    Ok(body)
}

const PROMPT_KEY: &[u8] = b"{\"prompt\":";

/// A bytes object of `len` bytes left as allocated: `PyBytes::new_with`
/// zeroes them first, a second pass over a body written whole.
fn uninitialized_bytes(py: Python<'_>, len: usize) -> PyResult<Bound<'_, PyBytes>> {
    let len = isize::try_from(len).map_err(|_| PyValueError::new_err("the body is too long"))?;
    // SAFETY: a null source asks CPython for an unfilled object of `len`
    // bytes; a null result is the error it raised.
    unsafe {
        Bound::from_owned_ptr_or_err(py, ffi::PyBytes_FromStringAndSize(std::ptr::null(), len))
            .map(|b| b.cast_into_unchecked())
    }
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
