//! What the router keeps of each decision: Prometheus figures (read at
//! scrape time) and the decision log's records (drained by its writer).

/// Seconds to decide one request: the default latency buckets.
pub const LATENCY_BOUNDS: [f64; 19] = [
    1e-5, 2.5e-5, 5e-5, 7.5e-5, 1e-4, 1.5e-4, 2e-4, 3e-4, 5e-4, 7.5e-4, 1e-3, 1.5e-3, 2e-3, 3e-3,
    5e-3, 1e-2, 5e-2, 0.25, 1.0,
];

/// Shares (cached blocks of the prompt): the default overlap buckets.
pub const RATIO_BOUNDS: [f64; 8] = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0];

use crate::ids::WorkerId;
use hashbrown::HashMap;

/// Bucket counts as Prometheus reads them: a value goes to the first bucket
/// whose upper bound is at least the value, or past the last one (+Inf).
#[derive(Clone, Debug)]
pub struct Histogram {
    pub bounds: Vec<f64>,
    pub counts: Vec<u64>,
    pub sum: f64,
}

impl Histogram {
    pub fn new(bounds: Vec<f64>) -> Histogram {
        let counts = vec![0; bounds.len() + 1];
        Histogram {
            bounds,
            counts,
            sum: 0.0,
        }
    }

    pub fn observe(&mut self, value: f64) {
        let bucket = self.bounds.partition_point(|bound| *bound < value);
        self.counts[bucket] += 1;
        self.sum += value;
    }
}

/// The role a decision booked a worker for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BookedAs {
    Decode,
    Prefill,
}

impl BookedAs {
    pub fn name(self) -> &'static str {
        match self {
            BookedAs::Decode => "decode",
            BookedAs::Prefill => "prefill",
        }
    }
}

#[derive(Clone, Debug)]
pub struct RouteStats {
    pub decisions: HashMap<(WorkerId, BookedAs), u64>,
    pub errors: HashMap<&'static str, u64>,
    /// Seconds to decide one request.
    pub latency: Histogram,
    /// Cached share of the prompt's blocks on the decode worker.
    pub overlap: Histogram,
    /// Bookings retired because their worker's report no longer counted them.
    pub retired_unreported: u64,
    /// Decisions a session's last worker won among tied candidates.
    pub by_affinity: u64,
}

impl RouteStats {
    pub fn new(latency_bounds: Vec<f64>, overlap_bounds: Vec<f64>) -> RouteStats {
        RouteStats {
            decisions: HashMap::new(),
            errors: HashMap::new(),
            latency: Histogram::new(latency_bounds),
            overlap: Histogram::new(overlap_bounds),
            retired_unreported: 0,
            by_affinity: 0,
        }
    }
}

/// One line of the decision log.
#[derive(Clone, Debug, PartialEq)]
pub struct DecisionRecord {
    /// Unix time, seconds.
    pub at: f64,
    pub request_id: String,
    pub decode_worker: u64,
    pub prefill_worker: Option<u64>,
    pub blocks: u64,
    pub overlap: u64,
    pub ttft_ms: f64,
    pub reason: String,
    pub micros: f64,
}

/// A decision-log line, in the shape of the service's other JSON logs.
#[derive(serde::Serialize)]
struct DecisionLine<'a> {
    ts: f64,
    level: &'static str,
    logger: &'static str,
    msg: &'static str,
    request_id: &'a str,
    decode_worker: u64,
    prefill_worker: Option<u64>,
    blocks: u64,
    overlap: u64,
    /// Non-finite numbers are written as null.
    ttft_ms: f64,
    reason: &'a str,
    us: f64,
}

/// The records as JSON lines, each ending in a newline.
pub fn json_lines(records: &[DecisionRecord]) -> String {
    let mut out = Vec::with_capacity(records.len() * 256);
    for r in records {
        let line = DecisionLine {
            ts: r.at,
            level: "info",
            logger: "kvrouter.decisions",
            msg: "routed",
            request_id: &r.request_id,
            decode_worker: r.decode_worker,
            prefill_worker: r.prefill_worker,
            blocks: r.blocks,
            overlap: r.overlap,
            ttft_ms: r.ttft_ms,
            reason: &r.reason,
            us: r.micros,
        };
        serde_json::to_writer(&mut out, &line).expect("a decision line serializes");
        out.push(b'\n');
    }
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_on_a_bound_counts_in_that_bucket() {
        let mut h = Histogram::new(vec![0.0, 0.5, 1.0]);
        for v in [0.0, 0.2, 0.5, 1.0, 3.0] {
            h.observe(v);
        }
        assert_eq!(h.counts, vec![1, 2, 1, 1]);
        assert_eq!(h.sum, 4.7);
    }

    #[test]
    fn decision_lines_are_json_with_null_for_non_finite_numbers() {
        let record = DecisionRecord {
            at: 1.5,
            request_id: "r\"1\u{e9}\n".into(),
            decode_worker: 3,
            prefill_worker: None,
            blocks: 10,
            overlap: 5,
            ttft_ms: f64::INFINITY,
            reason: "tie".into(),
            micros: 12.5,
        };
        let text = json_lines(&[
            record.clone(),
            DecisionRecord {
                prefill_worker: Some(7),
                ..record
            },
        ]);
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["request_id"], "r\"1\u{e9}\n");
        assert_eq!(lines[0]["ttft_ms"], serde_json::Value::Null);
        assert_eq!(lines[0]["prefill_worker"], serde_json::Value::Null);
        assert_eq!(lines[1]["prefill_worker"], 7);
        assert_eq!(lines[0]["msg"], "routed");
        assert!(text.ends_with('\n'));
    }
}
