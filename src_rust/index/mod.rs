//! The prefix index: which workers hold which cached prefixes.
//!
//! [`PrefixIndex`] is the thread-safe face: lookups share a read lock and run
//! side by side; event batches take the write lock once per call, so callers
//! batch writes with [`PrefixIndex::apply_many`], or hold it a slice at a time
//! for a big batch ([`PrefixIndex::apply_in_slices`]). Design notes: README.md.

mod arena;
mod events;
mod holding;
mod huge_pages;
mod overlap;
mod owner_sets;
mod sizing;
mod slot_table;
mod snapshot;
mod snapshot_frame;
mod tree;
mod validate;
mod workers;

pub use events::{
    block_size_mismatch, ApplyOutcome, BlockContent, EventBatch, IndexError, KvEvent, SeqStatus,
    StoredContent,
};
pub use overlap::{OverlapScores, TierDepths};
pub use snapshot::SnapshotMarks;
use tree::Started;
pub use tree::{PrefixTree, MAX_RESERVED_BLOCKS};

/// Blocks, plus one per event, that [`PrefixIndex::apply_in_slices`] applies
/// per hold of the lock: about a millisecond of work.
pub const SLICE_WORK: usize = 1024;

/// `events` cut into runs of about `work` blocks (plus one per event); an
/// event bigger than that is a run of its own.
fn slices<E: Borrow<KvEvent>>(events: &[E], work: usize) -> impl Iterator<Item = &[E]> {
    let mut rest = events;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (mut taken, mut end) = (0, 0);
        while let Some(event) = rest.get(end) {
            let weight = 1 + event_blocks(event.borrow());
            if end > 0 && taken + weight > work {
                break;
            }
            taken += weight;
            end += 1;
        }
        let (slice, tail) = rest.split_at(end);
        rest = tail;
        Some(slice)
    })
}

fn event_blocks(event: &KvEvent) -> usize {
    match event {
        KvEvent::Stored { block_ids, .. }
        | KvEvent::Removed { block_ids, .. }
        | KvEvent::EndsReusable { block_ids, .. } => block_ids.len(),
        KvEvent::Cleared => 0,
    }
}

use crate::ids::{SeqHash, WorkerId};
use parking_lot::{RwLock, RwLockWriteGuard};
use sizing::{Ask, Sizer};
use std::borrow::Borrow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sizing of a [`PrefixIndex`].
#[derive(Copy, Clone, Debug)]
pub struct IndexConfig {
    pub block_size: usize,
    /// Past this many blocks the least recently used are pruned. None: unbounded.
    pub max_nodes: Option<usize>,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig {
            block_size: crate::hashing::DEFAULT_BLOCK_SIZE,
            max_nodes: None,
        }
    }
}

/// Counts describing the index at one moment.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    pub blocks: usize,
    pub workers: usize,
    pub approximate: usize,
    pub pruned_total: u64,
    /// Bytes of the hash tables (sequence hashes, engine ids), reserved
    /// room included.
    pub table_bytes: usize,
}

/// One worker's place in the index.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct WorkerInfo {
    pub worker: WorkerId,
    pub blocks: usize,
    pub last_seq: Option<u64>,
}

/// What approximate entries expire by: the wall clock, or a time the owner
/// sets (a simulator running on virtual time).
enum Clock {
    Wall(Instant),
    Manual(AtomicU64),
}

pub struct PrefixIndex {
    /// Shared with the sizing thread, once a reservation is asked of it.
    tree: Arc<RwLock<PrefixTree>>,
    clock: Clock,
    sizer: Sizer,
}

impl PrefixIndex {
    pub fn new(config: IndexConfig) -> Self {
        Self::from_tree(PrefixTree::new(config.block_size, config.max_nodes))
    }

    fn from_tree(tree: PrefixTree) -> Self {
        let tree = Arc::new(RwLock::new(tree));
        PrefixIndex {
            sizer: Sizer::new(&tree),
            tree,
            clock: Clock::Wall(Instant::now()),
        }
    }

    /// An index whose approximate entries expire by the time given to
    /// [`PrefixIndex::set_time_ms`], starting at 0.
    pub fn with_manual_clock(config: IndexConfig) -> Self {
        PrefixIndex {
            clock: Clock::Manual(AtomicU64::new(0)),
            ..Self::new(config)
        }
    }

    /// Moves a manual clock forward; never backward. False on a wall clock.
    pub fn set_time_ms(&self, now_ms: u64) -> bool {
        match &self.clock {
            Clock::Manual(now) => {
                now.fetch_max(now_ms, Ordering::Relaxed);
                true
            }
            Clock::Wall(_) => false,
        }
    }

    pub fn block_size(&self) -> usize {
        self.tree.read().block_size
    }

    /// See [`PrefixTree::reserve`]: the tables are made before the write
    /// lock is taken, and swapped in under it (`sizing.rs`).
    pub fn reserve(&self, capacity_blocks: usize) {
        sizing::reserve(&self.tree, Ask::Capacity(capacity_blocks));
    }

    /// [`PrefixIndex::reserve`] on the index's sizing thread: returns at
    /// once, and a later call replaces one not yet begun. With reservations
    /// made directly too, the last to take effect stands.
    pub fn reserve_in_background(&self, capacity_blocks: usize) {
        self.sizer.ask(Ask::Capacity(capacity_blocks));
    }

    /// Waits until every reservation asked of the sizing thread is done.
    pub fn wait_sized(&self) {
        self.sizer.wait();
    }

    /// Has the name table brought to its reserved size if an engine's first
    /// ids just made it (for their batch alone). Called with the write lock still held: the
    /// sizing thread starts on it as soon as the lock is let go, or, in a
    /// sliced batch, between two slices.
    fn size_names(&self, tree: &PrefixTree) {
        if tree.arena.names_under_reservation() {
            self.sizer.ask(Ask::Current);
        }
    }

    fn now_ms(&self) -> u64 {
        match &self.clock {
            Clock::Wall(epoch) => epoch.elapsed().as_millis() as u64,
            Clock::Manual(now) => now.load(Ordering::Relaxed),
        }
    }

    pub fn apply<E: Borrow<KvEvent>>(
        &self,
        batch: &EventBatch<E>,
        strict: bool,
    ) -> Result<ApplyOutcome, IndexError> {
        let mut tree = self.tree.write();
        let outcome = tree.apply(batch, strict);
        self.size_names(&tree);
        outcome
    }

    /// Applies many batches under one lock acquisition; each gets its own result.
    pub fn apply_many<E: Borrow<KvEvent>>(
        &self,
        batches: &[EventBatch<E>],
        strict: bool,
    ) -> Vec<Result<ApplyOutcome, IndexError>> {
        let mut tree = self.tree.write();
        let outcomes = batches.iter().map(|b| tree.apply(b, strict)).collect();
        self.size_names(&tree);
        outcomes
    }

    pub fn resync<E: Borrow<KvEvent>>(
        &self,
        batch: &EventBatch<E>,
    ) -> Result<ApplyOutcome, IndexError> {
        let mut tree = self.tree.write();
        let outcome = tree.resync(batch);
        self.size_names(&tree);
        outcome
    }

    /// Applies a batch (a resync dump with `resync`) as `apply` and `resync`
    /// do, but lets waiting lookups and writers in between slices of about
    /// [`SLICE_WORK`] blocks, so that no batch holds the index for long. A
    /// lookup meanwhile may see part of the batch; a worker removed or
    /// resynced meanwhile gets no more of it, and the outcome counts the
    /// part applied. Another batch of the same worker's let in between is
    /// numbered against the batches finished before this one: a worker's
    /// stream is applied one batch at a time.
    pub fn apply_in_slices<E: Borrow<KvEvent>>(
        &self,
        batch: &EventBatch<E>,
        resync: bool,
    ) -> Result<ApplyOutcome, IndexError> {
        self.apply_sliced(batch, resync, SLICE_WORK)
    }

    fn apply_sliced<E: Borrow<KvEvent>>(
        &self,
        batch: &EventBatch<E>,
        resync: bool,
        work: usize,
    ) -> Result<ApplyOutcome, IndexError> {
        let mut tree = self.tree.write();
        let target = if resync {
            tree.start_resync(batch)?
        } else {
            match tree.start_apply(batch, false)? {
                Started::Done(outcome) => return Ok(outcome),
                Started::Apply(target) => target,
            }
        };
        let mut outcome = ApplyOutcome::with_status(SeqStatus::Applied);
        for slice in slices(&batch.events, work) {
            match tree.apply_slice(target, slice) {
                Some(part) => outcome.absorb(part),
                None => break,
            }
            self.size_names(&tree);
            RwLockWriteGuard::bump(&mut tree);
        }
        tree.finish_apply(target, batch.seq);
        Ok(outcome)
    }

    pub fn remove_worker(&self, worker: WorkerId) -> Result<usize, IndexError> {
        self.tree.write().remove_worker(worker)
    }

    pub fn find_matches(&self, seq_hashes: &[SeqHash], early_exit: bool) -> OverlapScores {
        let now = self.now_ms();
        let expiry_due = |tree: &PrefixTree| tree.next_expiry_ms().is_some_and(|at| at <= now);
        if expiry_due(&self.tree.read()) {
            self.tree.write().expire_approximate(now);
        }
        self.tree.read().find_matches(seq_hashes, early_exit)
    }

    pub fn insert_approximate(
        &self,
        worker: WorkerId,
        seq_hashes: &[SeqHash],
        ttl: Duration,
    ) -> Result<(), IndexError> {
        let now = self.now_ms();
        let mut tree = self.tree.write();
        tree.expire_approximate(now);
        tree.insert_approximate(worker, seq_hashes, now + ttl.as_millis() as u64)
    }

    pub fn num_approximate(&self) -> usize {
        self.tree.read().num_approximate()
    }

    pub fn stats(&self) -> IndexStats {
        let tree = self.tree.read();
        IndexStats {
            blocks: tree.num_nodes(),
            workers: tree.workers.len(),
            approximate: tree.num_approximate(),
            pruned_total: tree.pruned_total(),
            table_bytes: tree.table_bytes(),
        }
    }

    pub fn workers(&self) -> Vec<WorkerInfo> {
        let tree = self.tree.read();
        tree.workers
            .iter()
            .map(|(_, state)| WorkerInfo {
                worker: state.id,
                blocks: state.blocks,
                last_seq: state.last_seq,
            })
            .collect()
    }

    pub fn snapshot(&self, marks: SnapshotMarks) -> Vec<u8> {
        self.tree.read().to_snapshot(marks)
    }

    /// The index a snapshot holds, and the marks stored with it. A snapshot
    /// that is truncated, corrupt or of another format is refused.
    pub fn restore(bytes: &[u8]) -> Result<(PrefixIndex, SnapshotMarks), IndexError> {
        PrefixTree::from_snapshot(bytes).map(|(tree, marks)| (Self::from_tree(tree), marks))
    }
}

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod slice_tests;
#[cfg(test)]
mod slot_table_tests;
#[cfg(test)]
mod snapshot_tests;
#[cfg(test)]
mod tests;
