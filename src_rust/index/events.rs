//! KV events as the index consumes them, and what applying them reports.

use crate::hashing::{namespace_seed, BlockHasher};
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
    /// Blocks the worker holds, marked as ends a reused prefix may (or may
    /// not) stop at. A block stored is one; a hybrid engine marks those
    /// whose sliding-window group lacks the window before them, and reuses
    /// a prefix only as far as its deepest end.
    EndsReusable {
        block_ids: Vec<EngineBlockId>,
        reusable: bool,
    },
    /// The worker dropped its whole cache.
    Cleared,
}

/// How a `Stored` event names its blocks' content, as a worker sends it.
pub enum StoredContent<'a> {
    Tokens(&'a [u32]),
    LocalHashes(Vec<LocalHash>),
}

impl KvEvent {
    /// A `Stored` event from the fields a worker sends, its tokens hashed
    /// here (under `namespace`); with the tokens per block it carried (None
    /// for local hashes), for the index to check against its block size.
    /// The error says what is wrong with the event.
    pub fn stored(
        parent: Option<EngineBlockId>,
        block_ids: Vec<EngineBlockId>,
        content: StoredContent<'_>,
        tier: Tier,
        namespace: &str,
    ) -> Result<(KvEvent, Option<usize>), String> {
        if block_ids.is_empty() {
            return Err("stored event has no blocks".into());
        }
        let namespace_seed = namespace_seed(namespace);
        let (locals, tokens_per_block) = match content {
            StoredContent::Tokens(tokens) => {
                if tokens.is_empty() || tokens.len() % block_ids.len() != 0 {
                    return Err(format!(
                        "stored event has {} tokens for {} blocks; it needs the same positive number per block",
                        tokens.len(),
                        block_ids.len()
                    ));
                }
                let block_size = tokens.len() / block_ids.len();
                let locals = BlockHasher::new(block_size, namespace_seed).local_hashes(tokens);
                (locals, Some(block_size))
            }
            StoredContent::LocalHashes(locals) => {
                if locals.len() != block_ids.len() {
                    return Err(format!(
                        "stored event has {} local hashes for {} blocks",
                        locals.len(),
                        block_ids.len()
                    ));
                }
                (locals, None)
            }
        };
        let event = KvEvent::Stored {
            parent,
            block_ids,
            content: BlockContent::LocalHashes(locals),
            tier,
            namespace_seed,
        };
        Ok((event, tokens_per_block))
    }
}

/// The error for a stored event whose tokens per block differ from the index's.
pub fn block_size_mismatch(event: usize, tokens_per_block: usize, block_size: usize) -> String {
    format!(
        "event {event}: stored event has {tokens_per_block} tokens per block; the index's block_size is {block_size}"
    )
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

    /// Adds the block counts of a part of the same batch.
    pub fn absorb(&mut self, part: ApplyOutcome) {
        self.blocks_stored += part.blocks_stored;
        self.blocks_removed += part.blocks_removed;
        self.unknown_removals += part.unknown_removals;
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
