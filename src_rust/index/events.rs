//! KV events as the index consumes them, and what applying them reports.

use crate::ids::{EngineBlockId, LocalHash, Tier, WorkerId};
use thiserror::Error;

/// The content of the blocks of one `Stored` event: either their tokens (the
/// router hashes them itself), or router-compatible local hashes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockContent {
    /// All blocks' tokens, concatenated: exactly `block_size` per block.
    Tokens(Vec<u32>),
    LocalHashes(Vec<LocalHash>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// Consecutive blocks of one sequence, continuing after `parent` (None:
    /// they start a sequence).
    Stored {
        parent: Option<EngineBlockId>,
        block_ids: Vec<EngineBlockId>,
        content: BlockContent,
        tier: Tier,
        namespace_seed: u64,
    },
    Removed {
        block_ids: Vec<EngineBlockId>,
        tier: Tier,
    },
    /// The worker dropped its whole cache.
    Cleared,
}

/// One numbered batch of a worker's events. The events may be owned or
/// borrowed (`EventBatch<&KvEvent>`), so callers holding them elsewhere, such
/// as the Python bindings, need not copy them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventBatch<E = KvEvent> {
    pub worker: WorkerId,
    pub seq: u64,
    pub events: Vec<E>,
}

/// How a batch's sequence number related to the worker's stream.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SeqStatus {
    Applied,
    /// Already applied earlier; nothing changed.
    Duplicate,
    /// The batch skips ahead of `expected`; nothing was applied, and the
    /// worker needs a resync.
    Gap {
        expected: u64,
    },
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ApplyOutcome {
    pub status: SeqStatus,
    pub blocks_stored: usize,
    pub blocks_removed: usize,
    /// Removals of blocks the index did not hold for this worker (already
    /// removed, or pruned by the memory bound). Counted, not fatal.
    pub unknown_removals: usize,
}

impl ApplyOutcome {
    pub fn with_status(status: SeqStatus) -> Self {
        ApplyOutcome {
            status,
            blocks_stored: 0,
            blocks_removed: 0,
            unknown_removals: 0,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum IndexError {
    #[error("{0} is not in the index")]
    UnknownWorker(WorkerId),
    #[error("event {event}: {reason}")]
    MalformedEvent { event: usize, reason: String },
    #[error("event {event}: {worker} does not hold block {block:#x}")]
    UnknownBlock {
        event: usize,
        worker: WorkerId,
        block: u64,
    },
    #[error("event {event}: parent block {block:#x} is not held by {worker}")]
    UnknownParent {
        event: usize,
        worker: WorkerId,
        block: u64,
    },
    #[error("the index tracks at most {0} workers")]
    TooManyWorkers(u32),
    #[error("bad snapshot: {0}")]
    BadSnapshot(String),
}
