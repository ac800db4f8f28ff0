//! kvrouter's core: block hashing, the prefix index, the routing policy,
//! the routing decision that ties them together, and the routing call's
//! wire format. Pure Rust, tested with `cargo test`; the PyO3 bindings
//! live in `python`, behind the `python` feature, and only convert.

pub mod hashing;
pub mod ids;
pub mod index;
pub mod policy;
pub mod routing;
pub mod wire;

#[cfg(feature = "python")]
mod python;
