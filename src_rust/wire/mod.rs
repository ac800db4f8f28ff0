//! The hot calls on the wire: `RouteRequest` bytes checked and decoded,
//! and the `RouteResponse` for a decision encoded, so a decision made for
//! `Route` or `RouteStream` never builds Python objects (the decision itself
//! is `routing::Router`'s); and a worker's `PublishRequest` decoded into the
//! index's events (`events.rs`); and an OpenAI-compatible engine's streamed
//! answer read into token ids (`engine_stream.rs`). Design note: README.md.

mod engine_stream;
mod events;
mod messages;
mod route;

pub use engine_stream::{
    read_token_ids_json, token_ids_json_len, write_token_ids_json, CompletionStream,
    EngineStreamError, Finish, Piece, TokenLogprobs,
};
pub use events::{decode_publish, DecodedBatch, Publish};
pub use messages::{Candidate, Explanation, RouteError, RouteRequest, RouteResponse};
pub use route::{
    check_model, check_namespace, check_session, parse, prompt_length, Directory, Limits, Routable,
    MAX_SESSION_CHARS,
};

#[cfg(test)]
mod tests;
