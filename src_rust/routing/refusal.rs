//! How a routing call ends when it does not route: a status code as gRPC
//! names it, and a message a person can act on.

use crate::policy::RouteError;

/// The gRPC status codes a routing call can end with.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    Internal,
    NotFound,
    Unavailable,
}

impl Code {
    /// As `grpc.StatusCode` names it.
    pub fn name(self) -> &'static str {
        match self {
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::Internal => "INTERNAL",
            Code::NotFound => "NOT_FOUND",
            Code::Unavailable => "UNAVAILABLE",
        }
    }
}

/// A request the router turns down, with the status it answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub code: Code,
    pub message: String,
}

impl Refusal {
    pub fn invalid(message: String) -> Refusal {
        Refusal {
            code: Code::InvalidArgument,
            message,
        }
    }
}

impl From<RouteError> for Refusal {
    fn from(error: RouteError) -> Refusal {
        let code = match error {
            RouteError::DuplicateRequest(_) => Code::InvalidArgument,
            RouteError::NoWorker { .. } => Code::Unavailable,
            RouteError::UnknownModel(_) | RouteError::AmbiguousAdapter { .. } => Code::NotFound,
            // Raised by registry calls, never by routing: reaching it here
            // would be the router's fault.
            RouteError::UnknownWorker(_) => Code::Internal,
        };
        Refusal {
            code,
            message: error.to_string(),
        }
    }
}
