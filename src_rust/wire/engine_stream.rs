//! An OpenAI-compatible engine's streamed `/v1/completions` answer (vLLM,
//! SGLang; asked with `return_token_ids`), read as its bytes arrive: the
//! server-sent events cut out (an event may span reads, a read hold many),
//! each event's JSON parsed, and the first choice's `token_ids` and
//! `finish_reason` kept. One call per read returns what that read added,
//! so the router pays one crossing per read however many tokens it holds.
//!
//! The stream ends at its first finish reason or `data: [DONE]`; what
//! follows in the same read is not looked at.

use serde_json::Value;

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
        }
    }
}

/// How a choice finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
}

/// What one read added: the tokens of its events, in order; the finish
/// reason, when one came; `ended` once the stream is over (a finish or
/// `[DONE]`), after which nothing more is read.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Piece {
    pub tokens: Vec<u32>,
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
            ended: false,
        }
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
        let payload: Value = serde_json::from_slice(data).map_err(|_| {
            let text = String::from_utf8_lossy(data);
            EngineStreamError::Unreadable(text.chars().take(QUOTED_CHARS).collect())
        })?;
        let Value::Object(payload) = payload else {
            return Err(EngineStreamError::NotAnObject);
        };
        if let Some(error) = payload.get("error") {
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
        let Some(choice) = payload
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
        else {
            return Ok(()); // no choice: a usage summary
        };
        let finish = choice.get("finish_reason").filter(|r| !r.is_null());
        let Some(token_ids) = choice.get("token_ids").filter(|t| !t.is_null()) else {
            if !truthy(choice.get("text")) && finish.is_none() {
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

/// The bytes `token_ids_json` writes for `tokens`.
pub fn token_ids_json_len(tokens: &[u32]) -> usize {
    let digits: usize = tokens.iter().map(|t| decimal_digits(*t)).sum();
    2 + digits + tokens.len().saturating_sub(1)
}

/// `tokens` as a JSON array, for a request body that carries a prompt's ids,
/// written into `out`, which must be `token_ids_json_len(tokens)` bytes.
/// Each id is written from its last digit back, its length known first: a
/// long prompt's ids are most of an engine request's body.
pub fn write_token_ids_json(tokens: &[u32], out: &mut [u8]) {
    assert_eq!(out.len(), token_ids_json_len(tokens), "the buffer's length");
    out[0] = b'[';
    let mut at = 1;
    for (i, token) in tokens.iter().enumerate() {
        if i > 0 {
            out[at] = b',';
            at += 1;
        }
        let end = at + decimal_digits(*token);
        write_decimal(*token, &mut out[at..end]);
        at = end;
    }
    out[at] = b']';
}

/// "00" to "99", so that digits are written two at a time.
const DIGIT_PAIRS: &[u8; 200] = b"\
    0001020304050607080910111213141516171819\
    2021222324252627282930313233343536373839\
    4041424344454647484950515253545556575859\
    6061626364656667686970717273747576777879\
    8081828384858687888990919293949596979899";

/// `value`'s decimal digits into `out`, which is exactly as long.
fn write_decimal(mut value: u32, out: &mut [u8]) {
    let mut end = out.len();
    while value >= 100 {
        let pair = (value % 100) as usize * 2;
        value /= 100;
        out[end - 2..end].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
        end -= 2;
    }
    if value >= 10 {
        let pair = value as usize * 2;
        out[end - 2..end].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    } else {
        out[end - 1] = b'0' + value as u8;
    }
}

fn decimal_digits(value: u32) -> usize {
    match value {
        0..=9 => 1,
        10..=99 => 2,
        100..=999 => 3,
        1_000..=9_999 => 4,
        10_000..=99_999 => 5,
        100_000..=999_999 => 6,
        1_000_000..=9_999_999 => 7,
        10_000_000..=99_999_999 => 8,
        100_000_000..=999_999_999 => 9,
        _ => 10,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    proptest::proptest! {
        #[test]
        fn token_ids_json_is_what_serde_writes(tokens in proptest::collection::vec(proptest::num::u32::ANY, 0..64)) {
            proptest::prop_assert_eq!(token_ids_json(&tokens), serde_json::to_vec(&tokens).unwrap());
        }
    }
}
