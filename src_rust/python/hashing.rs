//! Python functions for block hashing.

use super::ints::Tokens;
use crate::hashing::{chain_all, model_namespace, namespace_seed, BlockHasher, DEFAULT_BLOCK_SIZE};
use crate::ids::{LocalHash, SeqHash};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyBytes;

pub fn hasher(block_size: usize, namespace: &str) -> PyResult<BlockHasher> {
    if block_size == 0 {
        return Err(PyValueError::new_err("block_size must be positive"));
    }
    Ok(BlockHasher::for_namespace(block_size, namespace))
}

/// Runs `hash` over the tokens with the GIL released.
fn hash_with<T: Send>(
    py: Python<'_>,
    tokens: &Bound<'_, PyAny>,
    block_size: usize,
    namespace: &str,
    hash: impl FnOnce(&BlockHasher, &[u32]) -> Vec<T> + Send,
) -> PyResult<Vec<T>> {
    let hasher = hasher(block_size, namespace)?;
    let tokens = Tokens::extract(tokens)?;
    Ok(py.detach(|| hash(&hasher, tokens.as_slice())))
}

/// Chained sequence hashes of the full blocks of `tokens`.
#[pyfunction]
#[pyo3(signature = (tokens, block_size = DEFAULT_BLOCK_SIZE, namespace = ""))]
pub fn hash_tokens(
    py: Python<'_>,
    tokens: &Bound<'_, PyAny>,
    block_size: usize,
    namespace: &str,
) -> PyResult<Vec<u64>> {
    hash_with(py, tokens, block_size, namespace, |hasher, tokens| {
        hasher.seq_hashes(tokens).into_iter().map(|h| h.0).collect()
    })
}

/// `hash_tokens` as a stdlib `array('Q')`: no Python int per hash, and
/// `PrefixIndex.find_matches` copies it once into native integers rather
/// than converting a Python int per block.
#[pyfunction]
#[pyo3(signature = (tokens, block_size = DEFAULT_BLOCK_SIZE, namespace = ""))]
pub fn hash_tokens_array<'py>(
    py: Python<'py>,
    tokens: &Bound<'py, PyAny>,
    block_size: usize,
    namespace: &str,
) -> PyResult<Bound<'py, PyAny>> {
    static ARRAY_TYPE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let hashes = hash_tokens(py, tokens, block_size, namespace)?;
    let bytes = PyBytes::new_with(py, hashes.len() * 8, |buffer| {
        for (chunk, hash) in buffer.chunks_exact_mut(8).zip(&hashes) {
            chunk.copy_from_slice(&hash.to_ne_bytes());
        }
        Ok(())
    })?;
    let array_type = ARRAY_TYPE.get_or_try_init(py, || {
        py.import("array")?.getattr("array").map(Bound::unbind)
    })?;
    array_type.bind(py).call1(("Q", bytes))
}

/// Local (unchained) hashes of the full blocks of `tokens`.
#[pyfunction]
#[pyo3(signature = (tokens, block_size = DEFAULT_BLOCK_SIZE, namespace = ""))]
pub fn local_block_hashes(
    py: Python<'_>,
    tokens: &Bound<'_, PyAny>,
    block_size: usize,
    namespace: &str,
) -> PyResult<Vec<u64>> {
    hash_with(py, tokens, block_size, namespace, |hasher, tokens| {
        hasher
            .local_hashes(tokens)
            .into_iter()
            .map(|h| h.0)
            .collect()
    })
}

/// Sequence hashes from local hashes, continuing after `parent`.
#[pyfunction]
#[pyo3(signature = (local_hashes, parent = None))]
pub fn chain_hashes(local_hashes: Vec<u64>, parent: Option<u64>) -> Vec<u64> {
    let locals: Vec<LocalHash> = local_hashes.into_iter().map(LocalHash).collect();
    chain_all(parent.map(SeqHash), &locals)
        .into_iter()
        .map(|h| h.0)
        .collect()
}

/// The hashing seed of a namespace.
#[pyfunction(name = "namespace_seed")]
pub fn py_namespace_seed(namespace: &str) -> u64 {
    namespace_seed(namespace)
}

/// The namespace a model's blocks hash in, salted by `namespace`: what a
/// worker serving `model` publishes its blocks under, and what the router
/// looks a request for `model` up in.
#[pyfunction(name = "model_namespace")]
pub fn py_model_namespace(model: &str, namespace: &str) -> String {
    model_namespace(model, namespace).into_owned()
}
