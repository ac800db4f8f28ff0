//! The routing call on the wire: `RouteRequest` bytes checked and decoded,
//! and the `RouteResponse` for a decision encoded, so a decision made for
//! `Route` or `RouteStream` never builds Python objects. The decision
//! itself is `routing::Router`'s. Design note: README.md.

mod messages;
mod route;

pub use messages::{Candidate, Explanation, RouteError, RouteRequest, RouteResponse};
pub use route::{check_model, check_namespace, parse, prompt_length, Directory, Limits, Routable};

#[cfg(test)]
mod tests;
