//! kvrouter's core: block hashing, the prefix index, the routing policy
//! and the routing call's wire format. Pure Rust; the PyO3 bindings live in `python`
//! behind the `python` feature.

pub mod hashing;
pub mod ids;
pub mod index;
pub mod policy;
pub mod wire;

#[cfg(feature = "python")]
mod python;
