//! Integer sequences from Python without copying where the layout allows:
//! token ids (u32) and block hashes (u64) arrive as lists, `array`s, numpy
//! arrays or raw bytes.

use pyo3::buffer::{Element, PyBuffer};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

enum TokenSource {
    U32(PyBuffer<u32>),
    /// Validated non-negative, so its bytes read as u32.
    I32(PyBuffer<i32>),
    /// Little-endian u32s, checked aligned and a multiple of 4 bytes.
    Bytes(PyBuffer<u8>),
    Owned(Vec<u32>),
}

/// Token ids borrowed from a Python buffer, or copied where they had to be.
/// Safe to read with the GIL released: the buffer export pins the memory.
pub struct Tokens(TokenSource);

const TOKENS_TYPE_HELP: &str =
    "tokens must be a list of ints, array('I'), a 1-D numpy uint32/int32/int64 array, or little-endian uint32 bytes";

pub(super) fn contiguous_slice<T: Element>(buffer: &PyBuffer<T>) -> &[T] {
    // SAFETY: only called on C-contiguous, 1-D buffers of T, which stay
    // exported (and so alive and unmoved) for as long as `buffer` lives.
    unsafe { std::slice::from_raw_parts(buffer.buf_ptr().cast::<T>(), buffer.item_count()) }
}

fn usable<T: Element>(buffer: &PyBuffer<T>) -> PyResult<bool> {
    if buffer.dimensions() != 1 {
        return Err(PyValueError::new_err(format!(
            "tokens must be 1-D, got {} dimensions",
            buffer.dimensions()
        )));
    }
    Ok(buffer.is_c_contiguous())
}

fn out_of_range(value: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("token id {value} is outside [0, 2**32)"))
}

fn check_non_negative(tokens: &[i32]) -> PyResult<()> {
    match tokens.iter().find(|t| **t < 0) {
        Some(bad) => Err(out_of_range(bad)),
        None => Ok(()),
    }
}

impl Tokens {
    pub fn extract(obj: &Bound<'_, PyAny>) -> PyResult<Tokens> {
        if let Some(tokens) = list_of(obj, |value| u32::try_from(value).ok()) {
            // Ints that are not Python ints (numpy scalars) take the generic path.
            let tokens = tokens
                .or_else(|_| obj.extract::<Vec<u32>>())
                .map_err(|_| PyValueError::new_err("token ids must be integers in [0, 2**32)"))?;
            return Ok(Tokens(TokenSource::Owned(tokens)));
        }
        let py = obj.py();
        if let Ok(buffer) = PyBuffer::<u32>::get(obj) {
            return Ok(Tokens(if usable(&buffer)? {
                TokenSource::U32(buffer)
            } else {
                TokenSource::Owned(buffer.to_vec(py)?)
            }));
        }
        if let Ok(buffer) = PyBuffer::<i32>::get(obj) {
            if usable(&buffer)? {
                check_non_negative(contiguous_slice(&buffer))?;
                return Ok(Tokens(TokenSource::I32(buffer)));
            }
            let signed = buffer.to_vec(py)?;
            check_non_negative(&signed)?;
            return Ok(Tokens(TokenSource::Owned(
                signed.into_iter().map(|t| t as u32).collect(),
            )));
        }
        if let Ok(buffer) = PyBuffer::<i64>::get(obj) {
            let wide = if usable(&buffer)? {
                contiguous_slice(&buffer).to_vec()
            } else {
                buffer.to_vec(py)?
            };
            let tokens = wide
                .into_iter()
                .map(|t| u32::try_from(t).map_err(|_| out_of_range(t)))
                .collect::<PyResult<Vec<u32>>>()?;
            return Ok(Tokens(TokenSource::Owned(tokens)));
        }
        if let Ok(buffer) = PyBuffer::<u8>::get(obj) {
            if !buffer.item_count().is_multiple_of(4) {
                return Err(PyValueError::new_err(format!(
                    "token bytes must hold whole little-endian uint32s; got {} bytes",
                    buffer.item_count()
                )));
            }
            let aligned = (buffer.buf_ptr() as usize).is_multiple_of(std::mem::align_of::<u32>());
            if usable(&buffer)? && aligned && cfg!(target_endian = "little") {
                return Ok(Tokens(TokenSource::Bytes(buffer)));
            }
            let bytes = buffer.to_vec(py)?;
            let tokens = bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            return Ok(Tokens(TokenSource::Owned(tokens)));
        }
        // An empty array('I') exports no memory at all, which PyBuffer refuses.
        // SAFETY: `obj` is a live object and the GIL is held.
        if unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } != 0 && matches!(obj.len(), Ok(0)) {
            return Ok(Tokens(TokenSource::Owned(Vec::new())));
        }
        Err(PyTypeError::new_err(format!(
            "{TOKENS_TYPE_HELP}; got {}",
            describe(obj)
        )))
    }

    pub fn as_slice(&self) -> &[u32] {
        match &self.0 {
            TokenSource::U32(buffer) => contiguous_slice(buffer),
            TokenSource::I32(buffer) => {
                let signed = contiguous_slice(buffer);
                // SAFETY: checked non-negative at extraction; same size and alignment.
                unsafe { std::slice::from_raw_parts(signed.as_ptr().cast::<u32>(), signed.len()) }
            }
            TokenSource::Bytes(buffer) => {
                let bytes = contiguous_slice(buffer);
                // SAFETY: checked 4-aligned and a multiple of 4 bytes at extraction.
                unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<u32>(), bytes.len() / 4) }
            }
            TokenSource::Owned(tokens) => tokens,
        }
    }
}

/// The ints of a list or tuple, read straight off the C API (PyO3's generic
/// sequence extraction costs several times more per element), each made a
/// `T` by `narrow` (None: out of T's range, an error). None when `obj` is
/// neither a list nor a tuple.
fn list_of<T>(
    obj: &Bound<'_, PyAny>,
    narrow: impl Fn(u64) -> Option<T>,
) -> Option<PyResult<Vec<T>>> {
    let (len, get_item): (isize, unsafe extern "C" fn(_, _) -> _) =
        if let Ok(list) = obj.cast::<PyList>() {
            (list.len() as isize, ffi::PyList_GetItem)
        } else if let Ok(tuple) = obj.cast::<PyTuple>() {
            (tuple.len() as isize, ffi::PyTuple_GetItem)
        } else {
            return None;
        };
    let mut values = Vec::with_capacity(len as usize);
    for i in 0..len {
        // SAFETY: we hold the GIL, `i` is in bounds, and the item reference is
        // borrowed from the container, which `obj` keeps alive; converting an
        // int runs no Python code that could resize it.
        let value = unsafe { int_as_u64(get_item(obj.as_ptr(), i)) };
        if value == u64::MAX {
            if let Some(error) = PyErr::take(obj.py()) {
                return Some(Err(error));
            }
        }
        match narrow(value) {
            Some(value) => values.push(value),
            None => return Some(Err(out_of_range(value))),
        }
    }
    Some(Ok(values))
}

/// A Python int as a u64 (`u64::MAX` with an error set when it is not one).
/// Where `unsigned long` is 64 bits, `PyLong_AsUnsignedLong` is the call:
/// CPython reads a multi-digit int's digits straight into it, where
/// `PyLong_AsUnsignedLongLong` goes through a byte array, 5x slower for the
/// 3-digit ints that block hashes are (13.6 against 5.1 ns an int here).
///
/// # Safety
/// The GIL is held and `item` is a live object.
unsafe fn int_as_u64(item: *mut ffi::PyObject) -> u64 {
    if std::mem::size_of::<std::os::raw::c_ulong>() == 8 {
        unsafe { ffi::PyLong_AsUnsignedLong(item) as u64 }
    } else {
        unsafe { ffi::PyLong_AsUnsignedLongLong(item) }
    }
}

/// Block hashes (u64) from a list of ints or a uint64/int64 buffer.
pub fn extract_hashes(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    if let Some(values) = list_of(obj, Some) {
        return values
            .or_else(|_| obj.extract::<Vec<u64>>())
            .map_err(|_| PyTypeError::new_err("block hashes must be ints in [0, 2**64)"));
    }
    if let Ok(buffer) = PyBuffer::<u64>::get(obj) {
        return buffer.to_vec(obj.py());
    }
    if let Ok(buffer) = PyBuffer::<i64>::get(obj) {
        return Ok(buffer
            .to_vec(obj.py())?
            .into_iter()
            .map(|h| h as u64)
            .collect());
    }
    obj.extract::<Vec<u64>>().map_err(|_| {
        PyTypeError::new_err(format!(
            "block hashes must be a list of ints in [0, 2**64) or a uint64 array; got {}",
            describe(obj)
        ))
    })
}

/// The type of a value, with a numpy dtype where it has one.
fn describe(obj: &Bound<'_, PyAny>) -> String {
    let type_name = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    match obj.getattr("dtype") {
        Ok(dtype) => format!("{type_name} of dtype {dtype}"),
        Err(_) => type_name,
    }
}
