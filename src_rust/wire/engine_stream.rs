//! An OpenAI-compatible engine's streamed `/v1/completions` answer (vLLM,
//! SGLang; asked with `return_token_ids`), read as its bytes arrive: the
//! server-sent events cut out (an event may span reads, a read hold many),
//! each event's JSON parsed, and the first choice's `token_ids` and
//! `finish_reason` kept. One call per read returns what that read added,
//! so the router pays one crossing per read however many tokens it holds.
//!
//! The stream ends at its first finish reason or `data: [DONE]`; what
//! follows in the same read is not looked at.
//!
//! A stream asked for log probabilities (`with_logprobs`) reads each
//! choice's `logprobs` too, in the shape of vLLM's completions asked with
//! `return_tokens_as_token_ids`: per token, `token_logprobs` and a
//! `top_logprobs` object keyed `"token_id:<id>"`, which holds the chosen
//! token as well as the most likely ones, in no promised order.

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use std::sync::OnceLock;

/// Why a stream cannot be read on; each is the engine's failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineStreamError {
    /// An event's data is longer than the limit the reader set.
    EventTooLong(usize),
    /// An event's data is not JSON.
    Unreadable(String),
    NotAnObject,
    /// The engine sent an error object; its message.
    EngineFailed(String),
    /// A choice with text but no `token_ids`: the engine was not asked for them, or cannot.
    NoTokenIds,
    BadTokenIds,
    /// A finish reason other than "stop" or "length" (an abort, say).
    EndedWith(String),
    /// Log probabilities were asked for, and a choice's tokens came without them.
    NoLogprobs,
    /// A choice's log probabilities are not one per token, or do not name token ids.
    BadLogprobs,
}

impl EngineStreamError {
    /// Whether the engine cannot serve what the request asked (log
    /// probabilities as ids), where another engine of its kind would fail
    /// alike: the request's failure, not the engine's.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Self::NoLogprobs | Self::BadLogprobs)
    }
}

impl std::fmt::Display for EngineStreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::EventTooLong(limit) => write!(f, "a streamed event is longer than {limit} bytes"),
            Self::Unreadable(start) => write!(f, "unreadable event {start:?}"),
            Self::NotAnObject => f.write_str("an event is not an object"),
            Self::EngineFailed(message) => write!(f, "the engine failed: {message}"),
            Self::NoTokenIds => f.write_str(
                "the engine streams no token_ids: it needs return_token_ids \
                 (vLLM 0.10.2 or later, SGLang with return_token_ids)",
            ),
            Self::BadTokenIds => f.write_str("token_ids are not token ids"),
            Self::EndedWith(reason) => write!(f, "the engine ended the request: {reason}"),
            Self::NoLogprobs => f.write_str(
                "the engine streams no log probabilities for its tokens (vLLM returns them)",
            ),
            Self::BadLogprobs => f.write_str(
                "the engine's log probabilities are not one per token or name no token ids \
                 (vLLM's return_tokens_as_token_ids)",
            ),
        }
    }
}

/// How a choice finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
}

/// A token's log probability, and the `top` most likely tokens' as
/// (token id, log probability), most likely first.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// What one read added: the tokens of its events, in order; when asked
/// for, their log probabilities, one each; the finish reason, when one
/// came; `ended` once the stream is over (a finish or `[DONE]`), after
/// which nothing more is read.
#[derive(Debug, Default, PartialEq)]
pub struct Piece {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<TokenLogprobs>,
    pub finish: Option<Finish>,
    pub ended: bool,
}

/// Of an unreadable event, how much the error quotes.
const QUOTED_CHARS: usize = 80;

#[derive(Debug)]
pub struct CompletionStream {
    /// Bytes after the last complete line.
    partial: Vec<u8>,
    /// The `data` lines of the event being read, joined by newlines.
    data: Vec<u8>,
    has_data: bool,
    limit: usize,
    /// How many most likely tokens each token's log probability comes
    /// with; None: none are read.
    top_logprobs: Option<usize>,
    ended: bool,
}

impl CompletionStream {
    /// `limit`: the most bytes an event's data may hold (a first event may
    /// echo the prompt's ids, so the caller sizes it by the prompt).
    pub fn new(limit: usize) -> Self {
        Self {
            partial: Vec::new(),
            data: Vec::new(),
            has_data: false,
            limit,
            top_logprobs: None,
            ended: false,
        }
    }

    /// The stream of a request asked for log probabilities with `top` most
    /// likely tokens: each choice's tokens must come with theirs.
    pub fn with_logprobs(mut self, top: usize) -> Self {
        self.top_logprobs = Some(top);
        self
    }

    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The next bytes of the body. Once the stream has ended, more bytes
    /// are ignored.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Piece, EngineStreamError> {
        let mut piece = Piece::default();
        if self.ended {
            piece.ended = true;
            return Ok(piece);
        }
        let mut rest = bytes;
        while let Some(newline) = rest.iter().position(|b| *b == b'\n') {
            let (head, tail) = rest.split_at(newline);
            rest = &tail[1..];
            let line: &[u8] = if self.partial.is_empty() {
                head
            } else {
                self.partial.extend_from_slice(head);
                &self.partial
            };
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let event_ended = line.is_empty();
            if !event_ended {
                if let Some(value) = line.strip_prefix(b"data:") {
                    let value = value.strip_prefix(b" ").unwrap_or(value);
                    if self.has_data {
                        self.data.push(b'\n');
                    }
                    self.data.extend_from_slice(value);
                    self.has_data = true;
                }
                // Other fields (event, id, retry) and comments say nothing we use.
            }
            self.partial.clear();
            if event_ended && self.has_data {
                let data = std::mem::take(&mut self.data);
                self.has_data = false;
                self.event(&data, &mut piece)?;
                if self.ended {
                    piece.ended = true;
                    return Ok(piece);
                }
            }
        }
        self.partial.extend_from_slice(rest);
        if self.partial.len() + self.data.len() > self.limit {
            return Err(EngineStreamError::EventTooLong(self.limit));
        }
        Ok(piece)
    }

    fn event(&mut self, data: &[u8], piece: &mut Piece) -> Result<(), EngineStreamError> {
        if data == b"[DONE]" {
            self.ended = true;
            return Ok(());
        }
        match serde_json::from_slice::<Event>(data) {
            Ok(event) => {
                let choice = event.choices.as_ref().map(|c| ChoiceFields {
                    text: c.text.as_ref(),
                    token_ids: c.token_ids.as_ref(),
                    logprobs: c.logprobs.as_ref(),
                    finish_reason: c.finish_reason.as_ref(),
                });
                self.read(event.error.as_ref(), choice, piece)
            }
            // Any other shape of JSON (not an object, a choice that is not
            // one, an escaped key) is read as a whole value: the reading
            // above agrees with this one wherever it succeeds.
            Err(_) => {
                let payload: Value = serde_json::from_slice(data).map_err(|_| {
                    let text = String::from_utf8_lossy(data);
                    EngineStreamError::Unreadable(text.chars().take(QUOTED_CHARS).collect())
                })?;
                let Value::Object(payload) = payload else {
                    return Err(EngineStreamError::NotAnObject);
                };
                let choice = payload
                    .get("choices")
                    .and_then(Value::as_array)
                    .and_then(|c| c.first())
                    .map(|c| ChoiceFields {
                        text: c.get("text"),
                        token_ids: c.get("token_ids"),
                        logprobs: c.get("logprobs"),
                        finish_reason: c.get("finish_reason"),
                    });
                self.read(payload.get("error"), choice, piece)
            }
        }
    }

    /// An event's error, or its first choice's tokens and finish reason.
    fn read(
        &mut self,
        error: Option<&Value>,
        choice: Option<ChoiceFields<'_>>,
        piece: &mut Piece,
    ) -> Result<(), EngineStreamError> {
        if let Some(error) = error {
            let message = match error {
                Value::Object(fields) => match fields.get("message") {
                    Some(Value::String(text)) => text.clone(),
                    Some(other) => other.to_string(),
                    None => String::new(),
                },
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            return Err(EngineStreamError::EngineFailed(message));
        }
        let Some(choice) = choice else {
            return Ok(()); // no choice: a usage summary
        };
        let finish = choice.finish_reason.filter(|r| !r.is_null());
        let Some(token_ids) = choice.token_ids.filter(|t| !t.is_null()) else {
            if !truthy(choice.text) && finish.is_none() {
                return Ok(());
            }
            return Err(EngineStreamError::NoTokenIds);
        };
        let ids = token_ids.as_array().ok_or(EngineStreamError::BadTokenIds)?;
        for id in ids {
            let id = id
                .as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or(EngineStreamError::BadTokenIds)?;
            piece.tokens.push(id);
        }
        if let Some(top) = self.top_logprobs.filter(|_| !ids.is_empty()) {
            let logprobs = choice
                .logprobs
                .filter(|l| !l.is_null())
                .ok_or(EngineStreamError::NoLogprobs)?;
            read_logprobs(logprobs, ids.len(), top, &mut piece.logprobs)?;
        }
        if let Some(reason) = finish {
            piece.finish = Some(match reason.as_str() {
                Some("stop") => Finish::Stop,
                Some("length") => Finish::Length,
                Some(other) => return Err(EngineStreamError::EndedWith(other.to_string())),
                None => return Err(EngineStreamError::EndedWith(reason.to_string())),
            });
            self.ended = true;
        }
        Ok(())
    }
}

/// An event as the engines send it, with only what is read kept: the rest
/// (a first event's echo of the prompt's ids, above all) is skipped
/// without being built. Only the common shape reads this way: an event
/// that is not an object, a choice that is not one or a key with escapes
/// fails here and is read as a whole value instead.
struct Event {
    /// Present, even as null, means failed.
    error: Option<Value>,
    /// The first choice.
    choices: Option<Choice>,
}

struct Choice {
    text: Option<Value>,
    token_ids: Option<Value>,
    logprobs: Option<Value>,
    finish_reason: Option<Value>,
}

/// A choice's fields, however the event was read.
struct ChoiceFields<'a> {
    text: Option<&'a Value>,
    token_ids: Option<&'a Value>,
    logprobs: Option<&'a Value>,
    finish_reason: Option<&'a Value>,
}

/// The log probabilities of a choice's `count` tokens, with the `top` most
/// likely tokens' each, added to `out`. vLLM writes a log probability of
/// -inf as a number it clamps to; null is read as -inf.
fn read_logprobs(
    logprobs: &Value,
    count: usize,
    top: usize,
    out: &mut Vec<TokenLogprobs>,
) -> Result<(), EngineStreamError> {
    let per_token = |key: &str| {
        logprobs
            .get(key)
            .and_then(Value::as_array)
            .filter(|values| values.len() == count)
            .ok_or(EngineStreamError::BadLogprobs)
    };
    let chosen = per_token("token_logprobs")?;
    let tops = per_token("top_logprobs")?;
    for (logprob, most_likely) in chosen.iter().zip(tops) {
        let logprob = read_logprob(logprob)?;
        let entries = match most_likely {
            Value::Object(entries) => entries,
            Value::Null if top == 0 => {
                out.push(TokenLogprobs {
                    logprob,
                    top: Vec::new(),
                });
                continue;
            }
            _ => return Err(EngineStreamError::BadLogprobs),
        };
        let mut ranked = entries
            .iter()
            .map(|(name, value)| {
                let id = name
                    .strip_prefix("token_id:")
                    .and_then(|id| id.parse::<u32>().ok())
                    .ok_or(EngineStreamError::BadLogprobs)?;
                Ok((id, read_logprob(value)?))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Most likely first; the chosen token, when it is not among them, falls off.
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        ranked.truncate(top);
        out.push(TokenLogprobs {
            logprob,
            top: ranked,
        });
    }
    Ok(())
}

fn read_logprob(value: &Value) -> Result<f32, EngineStreamError> {
    match value {
        Value::Null => Ok(f32::NEG_INFINITY),
        other => other
            .as_f64()
            .map(|v| v as f32)
            .ok_or(EngineStreamError::BadLogprobs),
    }
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EventVisitor;
        impl<'de> Visitor<'de> for EventVisitor {
            type Value = Event;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an event object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Event, A::Error> {
                let mut event = Event {
                    error: None,
                    choices: None,
                };
                // A repeated key: the last one counts, as in a whole value.
                while let Some(key) = map.next_key::<&str>()? {
                    match key {
                        "error" => event.error = Some(map.next_value()?),
                        "choices" => event.choices = map.next_value::<FirstChoice>()?.0,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(event)
            }
        }
        deserializer.deserialize_map(EventVisitor)
    }
}

impl<'de> Deserialize<'de> for Choice {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ChoiceVisitor;
        impl<'de> Visitor<'de> for ChoiceVisitor {
            type Value = Choice;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a choice object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Choice, A::Error> {
                let mut choice = Choice {
                    text: None,
                    token_ids: None,
                    logprobs: None,
                    finish_reason: None,
                };
                while let Some(key) = map.next_key::<&str>()? {
                    let field = match key {
                        "text" => &mut choice.text,
                        "token_ids" => &mut choice.token_ids,
                        "logprobs" => &mut choice.logprobs,
                        "finish_reason" => &mut choice.finish_reason,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    *field = Some(map.next_value()?);
                }
                Ok(choice)
            }
        }
        deserializer.deserialize_map(ChoiceVisitor)
    }
}

/// `choices`' first element (None: an empty list, or null); the others are skipped.
struct FirstChoice(Option<Choice>);

impl<'de> Deserialize<'de> for FirstChoice {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FirstChoiceVisitor;
        impl<'de> Visitor<'de> for FirstChoiceVisitor {
            type Value = FirstChoice;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of choices")
            }

            fn visit_unit<E: de::Error>(self) -> Result<FirstChoice, E> {
                Ok(FirstChoice(None))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut choices: A) -> Result<FirstChoice, A::Error> {
                let first = choices.next_element::<Choice>()?;
                while choices.next_element::<IgnoredAny>()?.is_some() {}
                Ok(FirstChoice(first))
            }
        }
        deserializer.deserialize_any(FirstChoiceVisitor)
    }
}

/// JSON's value as Python would test it: null, false, 0, "" and empty
/// containers are false.
fn truthy(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

/// The token ids in `json`, a JSON array of integers in 0..2³²; None for
/// any other JSON (a string, a list of strings or lists, a bool, a float,
/// an id out of range) or for what is not JSON. A client's prompt of ids is
/// read here in one pass, not made into a Python int per id; a digit costs
/// a few instructions (serde's reader took about 160 an id).
pub fn read_token_ids_json(json: &[u8]) -> Option<Vec<u32>> {
    let mut at = skip_json_space(json, 0);
    if json.get(at) != Some(&b'[') {
        return None;
    }
    at = skip_json_space(json, at + 1);
    let mut ids = Vec::with_capacity(json.len() / 4);
    if json.get(at) == Some(&b']') {
        return (skip_json_space(json, at + 1) == json.len()).then_some(ids);
    }
    loop {
        let start = at;
        let mut value = 0u64;
        while let Some(&byte) = json.get(at) {
            let digit = byte.wrapping_sub(b'0');
            if digit >= 10 {
                break;
            }
            // Wraps only past 19 digits, which the length check refuses.
            value = value.wrapping_mul(10).wrapping_add(u64::from(digit));
            at += 1;
        }
        let digits = at - start;
        // JSON writes no leading zeros.
        if digits == 0 || digits > 10 || (digits > 1 && json[start] == b'0') {
            return None;
        }
        ids.push(u32::try_from(value).ok()?);
        at = skip_json_space(json, at);
        match json.get(at) {
            Some(b',') => at = skip_json_space(json, at + 1),
            Some(b']') => return (skip_json_space(json, at + 1) == json.len()).then_some(ids),
            _ => return None,
        }
    }
}

/// The first position at or after `at` that is not JSON whitespace.
fn skip_json_space(json: &[u8], mut at: usize) -> usize {
    while matches!(json.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// The bytes `write_token_ids_json` writes for `tokens`.
pub fn token_ids_json_len(tokens: &[u32]) -> usize {
    let digits: usize = tokens.iter().map(|t| decimal_digits(*t)).sum();
    2 + digits + tokens.len().saturating_sub(1)
}

/// `tokens` as a JSON array, for a request body that carries a prompt's ids,
/// written into `out`, which must be `token_ids_json_len(tokens)` bytes.
///
/// A long prompt's ids are most of an engine request's body, so each id
/// costs a few instructions and no branch that its value steers but the
/// table's bound: the array is written from its end back, and an id under
/// `TABLED_IDS` (every id of most vocabularies) as one looked-up
/// eight-byte store of its comma and digits, right-aligned where its
/// digits end; the bytes before its comma land where the ids before it are
/// written next. The first id, ids within
/// eight bytes of the opening bracket, and larger ones are written digit
/// by digit.
pub fn write_token_ids_json(tokens: &[u32], out: &mut [u8]) {
    debug_assert_eq!(out.len(), token_ids_json_len(tokens), "the buffer's length");
    out[0] = b'[';
    let mut end = out.len() - 1;
    out[end] = b']';
    let Some((first, rest)) = tokens.split_first() else {
        return;
    };
    let table = comma_and_digits();
    for token in rest.iter().rev() {
        match table.get(*token as usize) {
            Some(entry) if end > 8 => {
                out[end - 8..end].copy_from_slice(&entry.to_le_bytes());
                end -= (entry & 0xff) as usize;
            }
            _ => {
                let digits = decimal_digits(*token);
                end -= digits;
                write_decimal(*token, &mut out[end..end + digits]);
                end -= 1;
                out[end] = b',';
            }
        }
    }
    write_decimal(*first, &mut out[1..end]);
}

/// Ids written by one lookup: every id of vocabularies up to 262,144
/// tokens (Llama 3's 128,256, Qwen2's 151,936, Gemma's 256,000), in a
/// table of 2 MiB made at the first call.
const TABLED_IDS: u32 = 1 << 18;

/// For each id under `TABLED_IDS`, eight bytes as they are stored (little
/// endian): a comma and the id's digits, right-aligned, and in the lowest
/// byte, which the store puts before the comma, how many they are.
fn comma_and_digits() -> &'static [u64] {
    static TABLE: OnceLock<Box<[u64]>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..TABLED_IDS)
            .map(|id| {
                let digits = decimal_digits(id);
                let mut bytes = [0u8; 8];
                write_decimal(id, &mut bytes[8 - digits..]);
                bytes[7 - digits] = b',';
                bytes[0] = digits as u8 + 1;
                u64::from_le_bytes(bytes)
            })
            .collect()
    })
}

/// `value`'s decimal digits into `out`, which is exactly as long.
fn write_decimal(mut value: u32, out: &mut [u8]) {
    for digit in out.iter_mut().rev() {
        *digit = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// How many decimal digits `value` has, from its bit length and one
/// comparison folded into an addition: no branch (Lemire's table).
fn decimal_digits(value: u32) -> usize {
    ((u64::from(value) + DIGITS_BY_BIT_LENGTH[(31 - (value | 1).leading_zeros()) as usize]) >> 32)
        as usize
}

/// For values of bit length i + 1, whose fewest digits are k: (k + 1)·2³²
/// less 10^k, so that adding a value carries into the top half exactly
/// when it has k + 1 digits; k·2³² where 10^k is past every u32.
const DIGITS_BY_BIT_LENGTH: [u64; 32] = {
    let mut table = [0u64; 32];
    let mut i = 0;
    while i < 32 {
        let smallest = 1u64 << i;
        let mut k = 1;
        let mut power = 10u64;
        while power <= smallest {
            k += 1;
            power *= 10;
        }
        table[i] = if power < 1 << 32 {
            ((k + 1) << 32) - power
        } else {
            k << 32
        };
        i += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy;

    fn token_ids_json(tokens: &[u32]) -> Vec<u8> {
        let mut out = vec![0; token_ids_json_len(tokens)];
        write_token_ids_json(tokens, &mut out);
        out
    }

    fn event(tokens: &[u32], finish: Option<&str>) -> String {
        let finish = finish.map_or("null".to_string(), |f| format!("{f:?}"));
        format!(
            "data: {{\"choices\":[{{\"index\":0,\"text\":\"x\",\"finish_reason\":{finish},\"token_ids\":{}}}]}}\n\n",
            String::from_utf8(token_ids_json(tokens)).unwrap()
        )
    }

    #[test]
    fn events_split_anywhere_give_the_same_tokens() {
        let body = [
            event(&[1, 2], None),
            ": a comment\n\n".to_string(),
            event(&[3], None),
            event(&[4], Some("length")),
            "data: [DONE]\n\n".to_string(),
        ]
        .concat();
        for cut in 0..body.len() {
            let mut stream = CompletionStream::new(1 << 20);
            let first = stream.feed(&body.as_bytes()[..cut]).unwrap();
            let second = stream.feed(&body.as_bytes()[cut..]).unwrap();
            let mut tokens = first.tokens.clone();
            tokens.extend(&second.tokens);
            assert_eq!(tokens, vec![1, 2, 3, 4], "cut at {cut}");
            assert_eq!(first.finish.or(second.finish), Some(Finish::Length));
            assert!(second.ended);
        }
    }

    #[test]
    fn what_follows_the_finish_is_not_read() {
        let body = event(&[1], Some("stop")) + "data: {not json\n\n";
        let mut stream = CompletionStream::new(1 << 20);
        let piece = stream.feed(body.as_bytes()).unwrap();
        assert_eq!(piece.tokens, vec![1]);
        assert_eq!(piece.finish, Some(Finish::Stop));
        assert!(piece.ended && stream.ended());
    }

    #[test]
    fn crlf_lines_and_multi_line_data_are_read() {
        let body =
            "data: {\"choices\":\r\ndata: [{\"token_ids\":[7],\"finish_reason\":null}]}\r\n\r\n";
        let piece = CompletionStream::new(1 << 20)
            .feed(body.as_bytes())
            .unwrap();
        assert_eq!(piece.tokens, vec![7]);
    }

    #[test]
    fn usage_summaries_and_empty_choices_add_nothing() {
        let body = "data: {\"choices\":[],\"usage\":{}}\n\ndata: {\"choices\":[{\"text\":\"\",\"finish_reason\":null}]}\n\n";
        let piece = CompletionStream::new(1 << 20)
            .feed(body.as_bytes())
            .unwrap();
        assert_eq!(piece, Piece::default());
    }

    #[test]
    fn each_bad_event_is_its_own_error() {
        let cases = [
            (
                "data: {nope\n\n",
                EngineStreamError::Unreadable("{nope".into()),
            ),
            ("data: [1]\n\n", EngineStreamError::NotAnObject),
            (
                "data: {\"error\":{\"message\":\"out of memory\"}}\n\n",
                EngineStreamError::EngineFailed("out of memory".into()),
            ),
            (
                "data: {\"choices\":[{\"text\":\"hi\",\"finish_reason\":null}]}\n\n",
                EngineStreamError::NoTokenIds,
            ),
            (
                "data: {\"choices\":[{\"token_ids\":[-1]}]}\n\n",
                EngineStreamError::BadTokenIds,
            ),
            (
                "data: {\"choices\":[{\"token_ids\":[4294967296]}]}\n\n",
                EngineStreamError::BadTokenIds,
            ),
            (
                "data: {\"choices\":[{\"token_ids\":[1.5]}]}\n\n",
                EngineStreamError::BadTokenIds,
            ),
            (
                "data: {\"choices\":[{\"token_ids\":[1],\"finish_reason\":\"abort\"}]}\n\n",
                EngineStreamError::EndedWith("abort".into()),
            ),
        ];
        for (body, error) in cases {
            let got = CompletionStream::new(1 << 20).feed(body.as_bytes());
            assert_eq!(got, Err(error), "{body}");
        }
    }

    #[test]
    fn every_shape_of_json_reads_as_a_whole_value_would() {
        let cases: &[(&str, Result<Vec<u32>, EngineStreamError>)] = &[
            // The prompt's echo is skipped, wherever it is.
            (
                r#"{"prompt_token_ids":[1,2],"choices":[{"prompt_token_ids":[3],"token_ids":[7],"text":"x"}]}"#,
                Ok(vec![7]),
            ),
            (r#"{"choices":[5]}"#, Ok(vec![])),
            (r#"{"choices":5}"#, Ok(vec![])),
            (r#"{"choices":null}"#, Ok(vec![])),
            (
                r#"{"choices":[{"token_ids":[1]},{"token_ids":"x"}]}"#,
                Ok(vec![1]),
            ),
            // A repeated key: the last one counts.
            (
                r#"{"choices":[{"token_ids":[1]}],"choices":[{"token_ids":[2]}]}"#,
                Ok(vec![2]),
            ),
            (
                r#"{"error":null}"#,
                Err(EngineStreamError::EngineFailed("null".into())),
            ),
            (r#"[1]"#, Err(EngineStreamError::NotAnObject)),
        ];
        for (event, want) in cases {
            let body = format!("data: {event}\n\n");
            let got = CompletionStream::new(1 << 20)
                .feed(body.as_bytes())
                .map(|piece| piece.tokens);
            assert_eq!(&got, want, "{event}");
        }
    }

    #[test]
    fn logprobs_asked_for_are_read_most_likely_first_and_cut_to_the_count() {
        // vLLM's shape: the chosen token (7) first, then the most likely ones.
        let body = concat!(
            r#"data: {"choices":[{"text":"ab","token_ids":[7,8],"logprobs":{"#,
            r#""tokens":["token_id:7","token_id:8"],"token_logprobs":[-2.5,null],"#,
            r#""top_logprobs":[{"token_id:7":-2.5,"token_id:3":-0.5,"token_id:9":-1.5},"#,
            r#"{"token_id:8":-0.25,"token_id:4":-3.0}],"text_offset":[0,1]}}]}"#,
            "\n\n"
        );
        let piece = CompletionStream::new(1 << 20)
            .with_logprobs(2)
            .feed(body.as_bytes())
            .unwrap();
        assert_eq!(piece.tokens, vec![7, 8]);
        let want = vec![
            TokenLogprobs {
                logprob: -2.5,
                top: vec![(3, -0.5), (9, -1.5)],
            },
            TokenLogprobs {
                logprob: f32::NEG_INFINITY,
                top: vec![(8, -0.25), (4, -3.0)],
            },
        ];
        assert_eq!(piece.logprobs, want);
        // Not asked for: not read.
        let piece = CompletionStream::new(1 << 20)
            .feed(body.as_bytes())
            .unwrap();
        assert!(piece.logprobs.is_empty());
    }

    #[test]
    fn tokens_without_the_logprobs_asked_for_are_unsupported() {
        let cases = [
            (event(&[1], None), EngineStreamError::NoLogprobs),
            (
                r#"data: {"choices":[{"token_ids":[1],"logprobs":{"token_logprobs":[],"top_logprobs":[]}}]}"#
                    .to_string()
                    + "\n\n",
                EngineStreamError::BadLogprobs,
            ),
            (
                r#"data: {"choices":[{"token_ids":[1],"logprobs":{"token_logprobs":[-1.0],"top_logprobs":[{"a":-1.0}]}}]}"#
                    .to_string()
                    + "\n\n",
                EngineStreamError::BadLogprobs,
            ),
        ];
        for (body, error) in cases {
            assert!(error.is_unsupported());
            let got = CompletionStream::new(1 << 20)
                .with_logprobs(1)
                .feed(body.as_bytes());
            assert_eq!(got, Err(error), "{body}");
        }
        // A last event with no tokens needs none.
        let piece = CompletionStream::new(1 << 20)
            .with_logprobs(1)
            .feed(event(&[], Some("stop")).as_bytes())
            .unwrap();
        assert_eq!(piece.finish, Some(Finish::Stop));
        assert!(!EngineStreamError::BadTokenIds.is_unsupported());
    }

    #[test]
    fn an_event_past_the_limit_is_refused() {
        let mut stream = CompletionStream::new(64);
        let long = format!("data: {}", "1".repeat(100));
        assert_eq!(
            stream.feed(long.as_bytes()),
            Err(EngineStreamError::EventTooLong(64))
        );
    }

    #[test]
    fn token_ids_are_written_as_a_json_array() {
        assert_eq!(token_ids_json(&[]), b"[]");
        assert_eq!(token_ids_json(&[0, 17, u32::MAX]), b"[0,17,4294967295]");
        // Both sides of the looked-up range, and ids near the bracket.
        assert_eq!(
            token_ids_json(&[5, 262_143, 262_144, 99_999_999, 7, 0]),
            b"[5,262143,262144,99999999,7,0]"
        );
    }

    proptest::proptest! {
        #[test]
        fn token_ids_json_is_what_serde_writes(tokens in proptest::collection::vec(
            proptest::prop_oneof![0..10u32, 0..1_000u32, 0..400_000u32, proptest::num::u32::ANY],
            0..64,
        )) {
            proptest::prop_assert_eq!(token_ids_json(&tokens), serde_json::to_vec(&tokens).unwrap());
        }

        #[test]
        fn token_ids_are_read_as_serde_reads_them(json in proptest::prop_oneof![
            // Arrays of numbers, good and bad, with JSON's whitespace about.
            (
                proptest::collection::vec(
                    "0|[1-9][0-9]{0,10}|0[0-9]|-[0-9]|[0-9][.e][0-9]|true|\"1\"",
                    0..6,
                ),
                "[ \t\r\n]{0,2}",
                "[ \t\r\n]{0,2}",
            )
                .prop_map(|(items, before, after): (Vec<String>, String, String)| {
                    format!("{before}[{}]{after}", items.join(", "))
                }),
            // Anything made of the same characters.
            "[\\[\\]0-9,. e\\-\n]{0,24}",
        ]) {
            let serde: Option<Vec<u32>> = serde_json::from_slice(json.as_bytes()).ok();
            proptest::prop_assert_eq!(read_token_ids_json(json.as_bytes()), serde, "{}", json);
        }

        #[test]
        fn token_ids_read_back_as_written(tokens in proptest::collection::vec(
            proptest::num::u32::ANY,
            0..64,
        )) {
            proptest::prop_assert_eq!(read_token_ids_json(&token_ids_json(&tokens)), Some(tokens));
        }
    }

    #[test]
    fn only_an_array_of_token_ids_reads_as_one() {
        assert_eq!(read_token_ids_json(b" [ 1 ,2,\n3 ] "), Some(vec![1, 2, 3]));
        let others: [&[u8]; 13] = [
            b"[01]",
            b"[1 2]",
            b"[1,]",
            b"\"text\"",
            b"[\"text\"]",
            b"[[1, 2]]",
            b"[1, true]",
            b"[1.0]",
            b"[-1]",
            b"[4294967296]",
            b"[1, null]",
            b"[1,",
            b"{}",
        ];
        for json in others {
            assert_eq!(
                read_token_ids_json(json),
                None,
                "{}",
                String::from_utf8_lossy(json)
            );
        }
    }
}
