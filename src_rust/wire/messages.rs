//! The Router service's routing messages from `proto/router.proto`
//! (package `kvrouter.v1`). Field numbers and types must match the .proto;
//! `tests/service/test_route_wire.py` round-trips them through the generated
//! Python classes, so a change to one side without the other fails there.

/// `kvrouter.v1.RouteRequest`
#[derive(Clone, PartialEq, prost::Message)]
pub struct RouteRequest {
    #[prost(string, tag = "1")]
    pub request_id: String,
    #[prost(uint32, repeated, tag = "2")]
    pub tokens: Vec<u32>,
    #[prost(bytes = "vec", tag = "3")]
    pub tokens_u32le: Vec<u8>,
    #[prost(string, tag = "4")]
    pub namespace: String,
    #[prost(bool, tag = "5")]
    pub explain: bool,
    #[prost(string, tag = "6")]
    pub model: String,
    #[prost(string, tag = "7")]
    pub session_id: String,
}

/// `kvrouter.v1.Candidate`
#[derive(Clone, PartialEq, prost::Message)]
pub struct Candidate {
    #[prost(uint64, tag = "1")]
    pub worker_id: u64,
    #[prost(string, tag = "2")]
    pub role: String,
    #[prost(uint32, tag = "3")]
    pub overlap_device: u32,
    #[prost(uint32, tag = "4")]
    pub overlap_host: u32,
    #[prost(uint32, tag = "5")]
    pub overlap_disk: u32,
    #[prost(double, tag = "6")]
    pub cost_ms: f64,
    #[prost(double, tag = "7")]
    pub queue_ms: f64,
    #[prost(double, tag = "8")]
    pub prefill_ms: f64,
    #[prost(double, tag = "9")]
    pub reload_ms: f64,
    #[prost(double, tag = "10")]
    pub decode_ms: f64,
    #[prost(double, tag = "11")]
    pub transfer_ms: f64,
    #[prost(double, tag = "12")]
    pub overflow_ms: f64,
    #[prost(uint32, tag = "13")]
    pub active_requests: u32,
    #[prost(bool, tag = "14")]
    pub overloaded: bool,
    #[prost(double, tag = "15")]
    pub congestion_ms: f64,
    #[prost(double, tag = "16")]
    pub stall_ms: f64,
    #[prost(double, tag = "17")]
    pub slowdown_ms: f64,
    #[prost(double, tag = "18")]
    pub pollution_ms: f64,
    #[prost(double, tag = "19")]
    pub tail_ms: f64,
}

/// `kvrouter.v1.Explanation`
#[derive(Clone, PartialEq, prost::Message)]
pub struct Explanation {
    #[prost(string, tag = "1")]
    pub reason: String,
    #[prost(message, repeated, tag = "2")]
    pub decode_candidates: Vec<Candidate>,
    #[prost(message, repeated, tag = "3")]
    pub prefill_candidates: Vec<Candidate>,
}

/// `kvrouter.v1.RouteError`
#[derive(Clone, PartialEq, prost::Message)]
pub struct RouteError {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

/// `kvrouter.v1.RouteResponse`
#[derive(Clone, PartialEq, prost::Message)]
pub struct RouteResponse {
    #[prost(string, tag = "1")]
    pub request_id: String,
    #[prost(uint64, tag = "2")]
    pub decode_worker: u64,
    #[prost(uint64, optional, tag = "3")]
    pub prefill_worker: Option<u64>,
    #[prost(bool, tag = "4")]
    pub disaggregated: bool,
    #[prost(string, tag = "5")]
    pub decode_address: String,
    #[prost(string, tag = "6")]
    pub prefill_address: String,
    #[prost(uint32, tag = "7")]
    pub num_blocks: u32,
    #[prost(double, tag = "8")]
    pub predicted_ttft_ms: f64,
    #[prost(message, optional, tag = "9")]
    pub explanation: Option<Explanation>,
    #[prost(message, optional, tag = "10")]
    pub error: Option<RouteError>,
}
