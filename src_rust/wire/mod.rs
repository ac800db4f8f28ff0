//! The routing call on the wire: `RouteRequest` bytes in, `RouteResponse`
//! bytes out, with validation, metrics and decision-log records kept here,
//! so a decision never builds Python objects. Design note: README.md.

mod messages;
mod route;
mod stats;

pub use messages::{Candidate, Explanation, RouteError, RouteRequest, RouteResponse};
pub use route::{
    check_namespace, parse, prompt_length, Code, Directory, Limits, Refusal, Routable,
};
pub use stats::{json_lines, BookedAs, DecisionRecord, Histogram, RouteStats};

#[cfg(test)]
mod tests;
