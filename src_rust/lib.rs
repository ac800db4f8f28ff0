//! kvrouter's core: block hashing, the prefix index and (later) load
//! accounting and scoring. Pure Rust; the PyO3 bindings live in `python`
//! behind the `python` feature.

pub mod hashing;
pub mod ids;
pub mod index;
pub mod policy;

#[cfg(feature = "python")]
mod python;
