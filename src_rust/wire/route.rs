//! A `RouteRequest` checked against the router's limits, and the
//! `RouteResponse` for a decision.

use super::messages::{self, RouteRequest, RouteResponse};
use crate::ids::WorkerId;
use crate::policy::{Candidate, Decision};
use crate::routing::Refusal;
use hashbrown::HashMap;
use prost::Message;

#[derive(Copy, Clone, Debug)]
pub struct Limits {
    pub max_prompt_tokens: usize,
    pub max_namespace_chars: usize,
    pub max_model_chars: usize,
    pub max_request_id_chars: usize,
}

/// A valid request: its prompt decoded, its id empty when the caller left
/// it to the router.
#[derive(Debug)]
pub struct Routable {
    pub request_id: String,
    pub tokens: Vec<u32>,
    pub namespace: String,
    pub model: String,
    /// Empty: no session.
    pub session: String,
    pub explain: bool,
}

/// Decodes and checks a `RouteRequest`. On refusal also returns the
/// request id, when the bytes got far enough to have one.
pub fn parse(bytes: &[u8], limits: &Limits) -> Result<Routable, (String, Refusal)> {
    let request = RouteRequest::decode(bytes).map_err(|e| {
        (
            String::new(),
            Refusal::invalid(format!("malformed RouteRequest: {e}")),
        )
    })?;
    check(request, limits)
}

fn check(request: RouteRequest, limits: &Limits) -> Result<Routable, (String, Refusal)> {
    let refuse = |message: String| (request.request_id.clone(), Refusal::invalid(message));
    prompt_length(
        request.tokens.len(),
        request.tokens_u32le.len(),
        limits.max_prompt_tokens,
    )
    .map_err(refuse)?;
    check_namespace(&request.namespace, limits.max_namespace_chars).map_err(refuse)?;
    check_model(&request.model, limits.max_model_chars).map_err(refuse)?;
    check_session(&request.session_id).map_err(refuse)?;
    if request.request_id.chars().count() > limits.max_request_id_chars {
        return Err(refuse(format!(
            "request_id is longer than {} characters",
            limits.max_request_id_chars
        )));
    }
    Ok(Routable {
        tokens: prompt_tokens(request.tokens, &request.tokens_u32le),
        request_id: request.request_id,
        namespace: request.namespace,
        model: request.model,
        session: request.session_id,
        explain: request.explain,
    })
}

/// The prompt as token ids, from whichever field carries it.
fn prompt_tokens(tokens: Vec<u32>, packed: &[u8]) -> Vec<u32> {
    if packed.is_empty() {
        return tokens;
    }
    packed
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The prompt's token count, given its `tokens` count and its
/// `tokens_u32le` byte length, if exactly one is set, whole and within
/// `max_tokens`.
pub fn prompt_length(
    tokens: usize,
    packed_bytes: usize,
    max_tokens: usize,
) -> Result<usize, String> {
    if packed_bytes > 0 && tokens > 0 {
        return Err("set only one of tokens and tokens_u32le".into());
    }
    if !packed_bytes.is_multiple_of(4) {
        return Err(format!(
            "tokens_u32le has {packed_bytes} bytes, not a multiple of 4"
        ));
    }
    let count = if packed_bytes > 0 {
        packed_bytes / 4
    } else {
        tokens
    };
    if count == 0 {
        return Err("the prompt is empty".into());
    }
    if count > max_tokens {
        return Err(format!(
            "the prompt has {count} tokens; this router accepts at most {max_tokens}"
        ));
    }
    Ok(count)
}

/// A namespace is printable and at most `max_chars` characters long.
pub fn check_namespace(namespace: &str, max_chars: usize) -> Result<(), String> {
    check_printable("namespace", namespace, max_chars)
}

/// A requested model name (`model` or `model:adapter`) is printable and
/// at most `max_chars` characters long.
pub fn check_model(model: &str, max_chars: usize) -> Result<(), String> {
    check_printable("model", model, max_chars)
}

/// The longest session id a request may name.
pub const MAX_SESSION_CHARS: usize = 256;

/// A session id is printable and at most `MAX_SESSION_CHARS` characters
/// long (the router keeps only its hash, so this bounds input, not memory).
pub fn check_session(session: &str) -> Result<(), String> {
    check_printable("session_id", session, MAX_SESSION_CHARS)
}

fn check_printable(field: &str, value: &str, max_chars: usize) -> Result<(), String> {
    let chars = value.chars().count();
    if chars > max_chars {
        return Err(format!(
            "{field} is {chars} characters; the limit is {max_chars}"
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(format!("{field} must not contain control characters"));
    }
    Ok(())
}

/// Registered workers' roles and addresses, for responses.
#[derive(Default)]
pub struct Directory {
    workers: HashMap<WorkerId, (String, String)>,
}

impl Directory {
    pub fn set(&mut self, worker: WorkerId, role: String, address: String) {
        self.workers.insert(worker, (role, address));
    }

    pub fn remove(&mut self, worker: WorkerId) {
        self.workers.remove(&worker);
    }

    fn role(&self, worker: WorkerId) -> &str {
        self.workers.get(&worker).map_or("", |(role, _)| role)
    }

    fn address(&self, worker: WorkerId) -> &str {
        self.workers.get(&worker).map_or("", |(_, address)| address)
    }

    fn candidate(&self, c: &Candidate) -> messages::Candidate {
        let k = &c.cost;
        messages::Candidate {
            worker_id: c.worker.0,
            role: self.role(c.worker).to_owned(),
            overlap_device: c.overlap.device,
            overlap_host: c.overlap.host,
            overlap_disk: c.overlap.disk,
            cost_ms: k.total(),
            queue_ms: k.queue_ms,
            prefill_ms: k.prefill_ms,
            reload_ms: k.reload_ms,
            decode_ms: k.decode_ms,
            transfer_ms: k.transfer_ms,
            overflow_ms: k.overflow_ms,
            active_requests: u32::try_from(c.active_requests).unwrap_or(u32::MAX),
            overloaded: c.overloaded,
            congestion_ms: k.congestion_ms,
            stall_ms: k.stall_ms,
            slowdown_ms: k.slowdown_ms,
            pollution_ms: k.pollution_ms,
            tail_ms: k.tail_ms,
        }
    }

    /// The response for a decision: every candidate with `explain`, else
    /// only the chosen ones.
    pub fn response(
        &self,
        request_id: &str,
        decision: &Decision,
        num_blocks: u64,
        explain: bool,
    ) -> RouteResponse {
        let shown = |candidates: &[Candidate], chosen: Option<WorkerId>| {
            candidates
                .iter()
                .filter(|c| explain || Some(c.worker) == chosen)
                .map(|c| self.candidate(c))
                .collect()
        };
        RouteResponse {
            request_id: request_id.to_owned(),
            decode_worker: decision.decode_worker.0,
            prefill_worker: decision.prefill_worker.map(|w| w.0),
            disaggregated: decision.prefill_worker.is_some(),
            decode_address: self.address(decision.decode_worker).to_owned(),
            prefill_address: decision
                .prefill_worker
                .map_or("", |w| self.address(w))
                .to_owned(),
            num_blocks: u32::try_from(num_blocks).unwrap_or(u32::MAX),
            predicted_ttft_ms: decision.predicted_ttft_ms,
            explanation: Some(messages::Explanation {
                reason: decision.reason.clone(),
                decode_candidates: shown(&decision.decode_candidates, Some(decision.decode_worker)),
                prefill_candidates: shown(&decision.prefill_candidates, decision.prefill_worker),
            }),
            error: None,
        }
    }
}
