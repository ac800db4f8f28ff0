//! The KvEvents service's `PublishRequest` (`proto/router.proto`, package
//! `kvrouter.v1`) decoded straight into the index's events, so a worker's
//! batch never becomes Python objects: a 40,000-event batch took 1.3 s of
//! Python to convert, and 20 ms here. Field numbers and types must match the
//! .proto; `tests/service/test_publish_wire.py` round-trips them through the
//! generated Python classes.

use crate::ids::{EngineBlockId, LocalHash, Tier};
use crate::index::{block_size_mismatch, KvEvent, StoredContent};
use prost::Message;

/// `kvrouter.v1.PublishRequest`
#[derive(Clone, PartialEq, prost::Message)]
pub struct PublishRequest {
    #[prost(oneof = "publish_request::Kind", tags = "1, 2")]
    pub kind: Option<publish_request::Kind>,
}

pub mod publish_request {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(message, tag = "1")]
        Hello(super::PublishHello),
        #[prost(message, tag = "2")]
        Batch(super::EventBatch),
    }
}

/// `kvrouter.v1.PublishHello`
#[derive(Clone, PartialEq, prost::Message)]
pub struct PublishHello {
    #[prost(uint64, tag = "1")]
    pub worker_id: u64,
    #[prost(uint64, tag = "2")]
    pub next_seq: u64,
    #[prost(uint32, tag = "3")]
    pub block_size: u32,
    #[prost(fixed64, tag = "4")]
    pub registration_token: u64,
}

/// `kvrouter.v1.EventBatch`
#[derive(Clone, PartialEq, prost::Message)]
pub struct EventBatch {
    #[prost(uint64, tag = "1")]
    pub seq: u64,
    #[prost(message, repeated, tag = "2")]
    pub events: Vec<WireEvent>,
    #[prost(bool, tag = "3")]
    pub resync: bool,
    #[prost(double, tag = "4")]
    pub emitted_at: f64,
}

/// `kvrouter.v1.KvEvent`
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireEvent {
    #[prost(oneof = "wire_event::Kind", tags = "1, 2, 3, 4")]
    pub kind: Option<wire_event::Kind>,
}

pub mod wire_event {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(message, tag = "1")]
        Stored(super::StoredEvent),
        #[prost(message, tag = "2")]
        Removed(super::RemovedEvent),
        #[prost(message, tag = "3")]
        Cleared(super::ClearedEvent),
        #[prost(message, tag = "4")]
        EndsReusable(super::EndsReusableEvent),
    }
}

/// `kvrouter.v1.StoredEvent`
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredEvent {
    #[prost(uint64, optional, tag = "1")]
    pub parent_block_id: Option<u64>,
    #[prost(uint64, repeated, tag = "2")]
    pub block_ids: Vec<u64>,
    #[prost(uint32, repeated, tag = "3")]
    pub token_ids: Vec<u32>,
    #[prost(uint64, repeated, tag = "4")]
    pub local_hashes: Vec<u64>,
    #[prost(int32, tag = "5")]
    pub tier: i32,
    #[prost(string, tag = "6")]
    pub namespace: String,
}

/// `kvrouter.v1.RemovedEvent`
#[derive(Clone, PartialEq, prost::Message)]
pub struct RemovedEvent {
    #[prost(uint64, repeated, tag = "1")]
    pub block_ids: Vec<u64>,
    #[prost(int32, tag = "2")]
    pub tier: i32,
}

/// `kvrouter.v1.EndsReusableEvent`
#[derive(Clone, PartialEq, prost::Message)]
pub struct EndsReusableEvent {
    #[prost(uint64, repeated, tag = "1")]
    pub block_ids: Vec<u64>,
    #[prost(bool, tag = "2")]
    pub reusable: bool,
}

/// `kvrouter.v1.ClearedEvent`
#[derive(Clone, PartialEq, prost::Message)]
pub struct ClearedEvent {}

/// A batch decoded and checked, its events ready for the index.
#[derive(Debug)]
pub struct DecodedBatch {
    pub seq: u64,
    pub resync: bool,
    pub emitted_at: f64,
    pub events: Vec<KvEvent>,
    pub blocks: usize,
}

/// What one `PublishRequest` held.
#[derive(Debug)]
pub enum Publish {
    Hello(PublishHello),
    Batch(DecodedBatch),
}

/// Decodes one `PublishRequest`, checking a batch's events as the index
/// would (shape, tier, block size) and that it has at most `max_events`. The
/// error names the batch, when the bytes got that far, and the event.
pub fn decode_publish(
    data: &[u8],
    block_size: usize,
    max_events: usize,
) -> Result<Publish, String> {
    let request =
        PublishRequest::decode(data).map_err(|e| format!("malformed PublishRequest: {e}"))?;
    match request.kind {
        Some(publish_request::Kind::Hello(hello)) => Ok(Publish::Hello(hello)),
        Some(publish_request::Kind::Batch(batch)) => {
            let seq = batch.seq;
            decode_batch(batch, block_size, max_events)
                .map(Publish::Batch)
                .map_err(|e| format!("batch {seq}: {e}"))
        }
        None => Err("empty PublishRequest (neither hello nor batch)".into()),
    }
}

fn decode_batch(
    batch: EventBatch,
    block_size: usize,
    max_events: usize,
) -> Result<DecodedBatch, String> {
    if batch.events.len() > max_events {
        return Err(format!(
            "{} events; a batch holds at most {max_events}",
            batch.events.len()
        ));
    }
    let mut blocks = 0;
    let events = batch
        .events
        .into_iter()
        .enumerate()
        .map(|(i, event)| {
            let event = decode_event(event, i, block_size)?;
            if let KvEvent::Stored { block_ids, .. } = &event {
                blocks += block_ids.len();
            }
            Ok(event)
        })
        .collect::<Result<_, String>>()?;
    Ok(DecodedBatch {
        seq: batch.seq,
        resync: batch.resync,
        emitted_at: batch.emitted_at,
        events,
        blocks,
    })
}

fn decode_event(event: WireEvent, i: usize, block_size: usize) -> Result<KvEvent, String> {
    match event.kind {
        Some(wire_event::Kind::Stored(stored)) => {
            let tier = tier(stored.tier, i)?;
            let parent = stored.parent_block_id.map(EngineBlockId);
            let block_ids = stored.block_ids.into_iter().map(EngineBlockId).collect();
            // Unset repeated fields read as empty: no local hashes means tokens.
            let content = match (stored.token_ids.is_empty(), stored.local_hashes.is_empty()) {
                (_, true) => StoredContent::Tokens(&stored.token_ids),
                (true, false) => StoredContent::LocalHashes(
                    stored.local_hashes.into_iter().map(LocalHash).collect(),
                ),
                (false, false) => {
                    return Err(format!(
                        "event {i}: Stored needs exactly one of token_ids or local_hashes"
                    ))
                }
            };
            let (event, tokens_per_block) =
                KvEvent::stored(parent, block_ids, content, tier, &stored.namespace)
                    .map_err(|e| format!("event {i}: {e}"))?;
            match tokens_per_block {
                Some(size) if size != block_size => Err(block_size_mismatch(i, size, block_size)),
                _ => Ok(event),
            }
        }
        Some(wire_event::Kind::Removed(removed)) => Ok(KvEvent::Removed {
            block_ids: removed.block_ids.into_iter().map(EngineBlockId).collect(),
            tier: tier(removed.tier, i)?,
        }),
        Some(wire_event::Kind::EndsReusable(ends)) => Ok(KvEvent::EndsReusable {
            block_ids: ends.block_ids.into_iter().map(EngineBlockId).collect(),
            reusable: ends.reusable,
        }),
        Some(wire_event::Kind::Cleared(_)) => Ok(KvEvent::Cleared),
        None => Err(format!(
            "event {i} is empty (no stored, removed, ends_reusable or cleared)"
        )),
    }
}

fn tier(value: i32, i: usize) -> Result<Tier, String> {
    usize::try_from(value)
        .ok()
        .and_then(|v| Tier::ALL.get(v).copied())
        .ok_or_else(|| format!("event {i}: unknown tier {value}"))
}
