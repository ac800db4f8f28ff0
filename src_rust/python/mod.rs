//! The `kvrouter._core` extension module: a thin layer over the pure-Rust
//! core. Each file converts Python values to the core's types and back;
//! decisions, validation and bookkeeping live in the core.

mod config;
mod decision;
mod engine_stream;
mod events;
mod hashing;
mod index;
mod ints;
mod publish;
mod router;

use pyo3::prelude::*;

/// Declared free-threading safe: every class but `PolicyConfig` and
/// `CompletionStream` is frozen and keeps its state behind its own locks
/// (the index's and the router's); those two go through PyO3's borrow
/// checking. None relies
/// on the GIL.
#[pymodule(gil_used = false)]
#[pyo3(name = "_core")]
fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(hashing::hash_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::hash_tokens_array, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::local_block_hashes, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::chain_hashes, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::py_namespace_seed, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::py_model_namespace, m)?)?;
    m.add_class::<events::PyTier>()?;
    m.add_class::<events::PyStored>()?;
    m.add_class::<events::PyRemoved>()?;
    m.add_class::<events::PyEndsReusable>()?;
    m.add_class::<events::PyCleared>()?;
    m.add_function(wrap_pyfunction!(publish::decode_publish_request, m)?)?;
    m.add_class::<publish::PyPublishHello>()?;
    m.add_class::<publish::PyDecodedBatch>()?;
    m.add_class::<index::PyApplyOutcome>()?;
    m.add_class::<index::PyOverlapScores>()?;
    m.add_class::<index::PyPrefixIndex>()?;
    m.add_class::<config::PyPolicyConfig>()?;
    m.add_class::<decision::PyCandidate>()?;
    m.add_class::<decision::PyExplanation>()?;
    m.add_class::<decision::PyDecision>()?;
    m.add_class::<decision::PyBooking>()?;
    m.add_class::<router::PyHistogram>()?;
    m.add_class::<router::PyRouteStats>()?;
    m.add_class::<router::PyRouter>()?;
    m.add_function(wrap_pyfunction!(router::check_namespace, m)?)?;
    m.add_function(wrap_pyfunction!(router::check_model, m)?)?;
    m.add_function(wrap_pyfunction!(router::prompt_length, m)?)?;
    m.add_class::<engine_stream::PyCompletionStream>()?;
    m.add_function(wrap_pyfunction!(engine_stream::prompt_body_json, m)?)?;
    m.add_function(wrap_pyfunction!(engine_stream::token_ids_from_json, m)?)?;
    m.add("RouteRefused", m.py().get_type::<router::RouteRefused>())?;
    m.add("UnknownModel", m.py().get_type::<router::UnknownModel>())?;
    m.add(
        "NoWorkerAvailable",
        m.py().get_type::<router::NoWorkerAvailable>(),
    )?;
    m.add("DEFAULT_BLOCK_SIZE", crate::hashing::DEFAULT_BLOCK_SIZE)?;
    m.add("ADAPTER_SEPARATOR", crate::policy::ADAPTER_SEPARATOR)?;
    m.add("MAX_SESSION_CHARS", crate::wire::MAX_SESSION_CHARS)?;
    Ok(())
}
