//! The prefix index itself, single-threaded; `PrefixIndex` wraps it in a lock.
//! See README.md next to this file for the layout and its trade-offs.

use super::events::{ApplyOutcome, BlockContent, EventBatch, IndexError, KvEvent, SeqStatus};
use super::overlap::{OverlapScores, TierDepths};
use super::owners::{Holding, Owners, Removal, SpillSlab, TierSet};
use super::workers::WorkerTable;
use crate::hashing::{chain, BlockHasher};
use crate::ids::{EngineBlockId, SeqHash, Tier, WorkerId};
use hashbrown::hash_map::Entry;
use hashbrown::HashMap;
use rustc_hash::{FxBuildHasher, FxHashMap, FxHashSet};
use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU32, Ordering};

pub(crate) struct Node {
    pub owners: Owners,
    /// Logical time of the last lookup or store that touched this block; an
    /// atomic so that lookups can record it under a shared lock.
    last_access: AtomicU32,
}

impl Node {
    pub fn new(owners: Owners, tick: u32) -> Self {
        Node {
            owners,
            last_access: AtomicU32::new(tick),
        }
    }

    fn touch(&self, tick: u32) {
        self.last_access.store(tick, Ordering::Relaxed);
    }
}

pub struct PrefixTree {
    pub(crate) block_size: usize,
    pub(crate) max_nodes: Option<usize>,
    pub(crate) nodes: HashMap<SeqHash, Node, FxBuildHasher>,
    pub(crate) spill: SpillSlab,
    pub(crate) workers: WorkerTable,
    clock: AtomicU32,
    pruned: u64,
    /// The authoritative expiry (ms) of each approximate holding.
    approx_expiry: FxHashMap<(SeqHash, u32), u64>,
    /// Expiries in time order; an entry is stale when `approx_expiry` disagrees.
    approx_queue: BinaryHeap<Reverse<(u64, SeqHash, u32)>>,
}

impl PrefixTree {
    pub fn new(block_size: usize, max_nodes: Option<usize>) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        PrefixTree {
            block_size,
            max_nodes,
            nodes: HashMap::with_hasher(FxBuildHasher),
            spill: SpillSlab::default(),
            workers: WorkerTable::default(),
            clock: AtomicU32::new(0),
            pruned: 0,
            approx_expiry: FxHashMap::default(),
            approx_queue: BinaryHeap::new(),
        }
    }

    fn tick(&self) -> u32 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// Applies one batch if it is the worker's next; see [`SeqStatus`].
    /// With `strict`, a removal of a block the worker does not hold, or a
    /// parent it does not hold, rejects the whole batch unapplied.
    pub fn apply(&mut self, batch: &EventBatch, strict: bool) -> Result<ApplyOutcome, IndexError> {
        self.validate_shape(&batch.events)?;
        let existing = self.workers.slot_of(batch.worker);
        let expected = existing.map_or(0, |slot| self.workers.state(slot).expected_seq());
        if batch.seq < expected {
            return Ok(ApplyOutcome::with_status(SeqStatus::Duplicate));
        }
        if batch.seq > expected {
            return Ok(ApplyOutcome::with_status(SeqStatus::Gap { expected }));
        }
        if strict {
            self.validate_known(batch.worker, existing, &batch.events)?;
        }
        let slot = self.workers.get_or_insert(batch.worker)?;
        let outcome = self.apply_events(slot, &batch.events);
        self.workers.state_mut(slot).last_seq = Some(batch.seq);
        self.prune_if_needed();
        Ok(outcome)
    }

    /// Replaces everything known about the worker with `batch` (a full dump
    /// of its cache), and continues its stream after `batch.seq`.
    pub fn resync(&mut self, batch: &EventBatch) -> Result<ApplyOutcome, IndexError> {
        self.validate_shape(&batch.events)?;
        let slot = self.workers.get_or_insert(batch.worker)?;
        self.clear_worker(slot);
        let outcome = self.apply_events(slot, &batch.events);
        self.workers.state_mut(slot).last_seq = Some(batch.seq);
        self.prune_if_needed();
        Ok(outcome)
    }

    /// Drops the worker and all its blocks; returns how many it held.
    pub fn remove_worker(&mut self, worker: WorkerId) -> Result<usize, IndexError> {
        let slot = self
            .workers
            .slot_of(worker)
            .ok_or(IndexError::UnknownWorker(worker))?;
        let blocks = self.workers.state(slot).blocks;
        self.drop_holdings(slot);
        self.workers.remove(worker);
        Ok(blocks)
    }

    /// Per worker, the length of the longest cached prefix of `seq_hashes`.
    /// With `early_exit`, stops once a single worker is left matching.
    pub fn find_matches(&self, seq_hashes: &[SeqHash], early_exit: bool) -> OverlapScores {
        let tick = self.tick();
        let bound = self.workers.slot_bound();
        let mut depth = vec![0u32; bound];
        let mut tiers = vec![TierDepths::default(); bound];
        for (i, seq) in seq_hashes.iter().enumerate() {
            let Some(node) = self.nodes.get(seq) else {
                break;
            };
            node.touch(tick);
            let mut alive = 0;
            for holding in node.owners.as_slice(&self.spill) {
                let slot = holding.slot() as usize;
                if depth[slot] == i as u32 {
                    depth[slot] += 1;
                    tiers[slot].add(holding.tiers().best());
                    alive += 1;
                }
            }
            if alive == 0 || (early_exit && alive == 1) {
                break;
            }
        }
        let scores = self
            .workers
            .iter()
            .filter(|(slot, _)| depth[*slot as usize] > 0)
            .map(|(slot, state)| (state.id, tiers[slot as usize]))
            .collect();
        OverlapScores { scores }
    }

    /// Records that `worker` will soon hold these blocks, until `expiry_ms`
    /// or until an event confirms or removes them.
    pub fn insert_approximate(
        &mut self,
        worker: WorkerId,
        seq_hashes: &[SeqHash],
        expiry_ms: u64,
    ) -> Result<(), IndexError> {
        let slot = self.workers.get_or_insert(worker)?;
        let tick = self.tick();
        for &seq in seq_hashes {
            match self.nodes.entry(seq) {
                Entry::Vacant(vacant) => {
                    vacant.insert(Node::new(Owners::One(Holding::approximate(slot)), tick));
                }
                Entry::Occupied(occupied) => {
                    let node = occupied.into_mut();
                    node.touch(tick);
                    match node.owners.get(&self.spill, slot) {
                        Some(held) if !held.is_approximate() => continue,
                        Some(_) => {}
                        None => {
                            node.owners.set(&mut self.spill, Holding::approximate(slot));
                        }
                    }
                }
            }
            self.approx_expiry.insert((seq, slot), expiry_ms);
            self.approx_queue.push(Reverse((expiry_ms, seq, slot)));
        }
        self.prune_if_needed();
        Ok(())
    }

    /// The earliest pending approximate expiry, if any.
    pub fn next_expiry_ms(&self) -> Option<u64> {
        self.approx_queue.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Drops approximate holdings whose time has come.
    pub fn expire_approximate(&mut self, now_ms: u64) {
        while let Some(&Reverse((at, seq, slot))) = self.approx_queue.peek() {
            if at > now_ms {
                break;
            }
            self.approx_queue.pop();
            if self.approx_expiry.get(&(seq, slot)) != Some(&at) {
                continue;
            }
            self.approx_expiry.remove(&(seq, slot));
            let Some(node) = self.nodes.get_mut(&seq) else {
                continue;
            };
            if node
                .owners
                .get(&self.spill, slot)
                .is_some_and(Holding::is_approximate)
            {
                self.remove_holding(seq, slot);
            }
        }
    }

    pub fn num_nodes(&self) -> usize {
        self.nodes.len()
    }

    pub fn num_approximate(&self) -> usize {
        self.approx_expiry.len()
    }

    pub fn pruned_total(&self) -> u64 {
        self.pruned
    }

    fn validate_shape(&self, events: &[KvEvent]) -> Result<(), IndexError> {
        for (index, event) in events.iter().enumerate() {
            let KvEvent::Stored {
                block_ids, content, ..
            } = event
            else {
                continue;
            };
            let malformed = |reason: String| IndexError::MalformedEvent {
                event: index,
                reason,
            };
            if block_ids.is_empty() {
                return Err(malformed("stored event has no blocks".into()));
            }
            match content {
                BlockContent::Tokens(tokens)
                    if tokens.len() != block_ids.len() * self.block_size =>
                {
                    return Err(malformed(format!(
                        "stored event has {} tokens for {} blocks; with block_size {} it needs {}",
                        tokens.len(),
                        block_ids.len(),
                        self.block_size,
                        block_ids.len() * self.block_size
                    )));
                }
                BlockContent::LocalHashes(hashes) if hashes.len() != block_ids.len() => {
                    return Err(malformed(format!(
                        "stored event has {} local hashes for {} blocks",
                        hashes.len(),
                        block_ids.len()
                    )));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Strict mode: every parent and removed block must be held by the worker
    /// at that point of the batch.
    fn validate_known(
        &self,
        worker: WorkerId,
        slot: Option<u32>,
        events: &[KvEvent],
    ) -> Result<(), IndexError> {
        let held_before = |block: EngineBlockId| {
            slot.is_some_and(|slot| {
                let seq = self.workers.state(slot).seq_hash_of(block);
                self.nodes
                    .get(&seq)
                    .and_then(|node| node.owners.get(&self.spill, slot))
                    .is_some_and(|held| !held.is_approximate())
            })
        };
        let mut added = FxHashSet::default();
        let mut removed = FxHashSet::default();
        let mut cleared = false;
        let known = |block: &EngineBlockId,
                     added: &FxHashSet<EngineBlockId>,
                     removed: &FxHashSet<EngineBlockId>,
                     cleared: bool| {
            added.contains(block) || (!cleared && !removed.contains(block) && held_before(*block))
        };
        for (event, kv_event) in events.iter().enumerate() {
            match kv_event {
                KvEvent::Stored {
                    parent, block_ids, ..
                } => {
                    if let Some(parent) = parent {
                        if !known(parent, &added, &removed, cleared) {
                            return Err(IndexError::UnknownParent {
                                event,
                                worker,
                                block: parent.0,
                            });
                        }
                    }
                    for block in block_ids {
                        removed.remove(block);
                        added.insert(*block);
                    }
                }
                KvEvent::Removed { block_ids, .. } => {
                    for block in block_ids {
                        if !known(block, &added, &removed, cleared) {
                            return Err(IndexError::UnknownBlock {
                                event,
                                worker,
                                block: block.0,
                            });
                        }
                        added.remove(block);
                        removed.insert(*block);
                    }
                }
                KvEvent::Cleared => {
                    cleared = true;
                    added.clear();
                    removed.clear();
                }
            }
        }
        Ok(())
    }

    fn apply_events(&mut self, slot: u32, events: &[KvEvent]) -> ApplyOutcome {
        let tick = self.tick();
        let mut outcome = ApplyOutcome::with_status(SeqStatus::Applied);
        for event in events {
            match event {
                KvEvent::Stored {
                    parent,
                    block_ids,
                    content,
                    tier,
                    namespace_seed,
                } => {
                    let locals = match content {
                        BlockContent::Tokens(tokens) => Cow::Owned(
                            BlockHasher::new(self.block_size, *namespace_seed).local_hashes(tokens),
                        ),
                        BlockContent::LocalHashes(hashes) => Cow::Borrowed(hashes),
                    };
                    let mut prev = parent.map(|p| self.workers.state(slot).seq_hash_of(p));
                    if let Some(node) = prev.and_then(|seq| self.nodes.get(&seq)) {
                        node.touch(tick);
                    }
                    for (&block, &local) in block_ids.iter().zip(locals.iter()) {
                        let seq = chain(prev, local);
                        prev = Some(seq);
                        self.store_block(slot, block, seq, *tier, tick);
                    }
                    outcome.blocks_stored += block_ids.len();
                }
                KvEvent::Removed { block_ids, tier } => {
                    for &block in block_ids {
                        if self.remove_block(slot, block, *tier) {
                            outcome.blocks_removed += 1;
                        } else {
                            outcome.unknown_removals += 1;
                        }
                    }
                }
                KvEvent::Cleared => self.clear_worker(slot),
            }
        }
        outcome
    }

    fn store_block(
        &mut self,
        slot: u32,
        block: EngineBlockId,
        seq: SeqHash,
        tier: Tier,
        tick: u32,
    ) {
        let state = self.workers.state_mut(slot);
        if block.0 != seq.0 {
            state.engine_ids.insert(block, seq);
        }
        match self.nodes.entry(seq) {
            Entry::Vacant(vacant) => {
                let holding = Holding::confirmed(slot, TierSet::only(tier));
                vacant.insert(Node::new(Owners::One(holding), tick));
                state.blocks += 1;
            }
            Entry::Occupied(occupied) => {
                let node = occupied.into_mut();
                node.touch(tick);
                let previous = node.owners.get(&self.spill, slot);
                let tiers = match previous {
                    Some(held) if !held.is_approximate() => held.tiers().with(tier),
                    _ => TierSet::only(tier),
                };
                node.owners
                    .set(&mut self.spill, Holding::confirmed(slot, tiers));
                match previous {
                    None => state.blocks += 1,
                    Some(held) if held.is_approximate() => {
                        state.blocks += 1;
                        self.approx_expiry.remove(&(seq, slot));
                    }
                    Some(_) => {}
                }
            }
        }
    }

    /// Returns whether the worker held the block in that tier.
    fn remove_block(&mut self, slot: u32, block: EngineBlockId, tier: Tier) -> bool {
        let seq = self.workers.state(slot).seq_hash_of(block);
        let held = self
            .nodes
            .get(&seq)
            .and_then(|node| node.owners.get(&self.spill, slot))
            .filter(|held| !held.is_approximate() && held.tiers() != held.tiers().without(tier));
        let Some(held) = held else {
            return false;
        };
        let remaining = held.tiers().without(tier);
        if remaining.is_empty() {
            let state = self.workers.state_mut(slot);
            state.engine_ids.remove(&block);
            self.remove_holding(seq, slot);
        } else {
            let node = self.nodes.get_mut(&seq).expect("checked above");
            node.owners
                .set(&mut self.spill, Holding::confirmed(slot, remaining));
        }
        true
    }

    /// Removes one holding, dropping the node when it was the last.
    fn remove_holding(&mut self, seq: SeqHash, slot: u32) {
        let Some(node) = self.nodes.get_mut(&seq) else {
            return;
        };
        let gone = match node.owners.remove(&mut self.spill, slot) {
            Removal::Absent => return,
            Removal::Removed(gone) => gone,
            Removal::Emptied(gone) => {
                let node = self.nodes.remove(&seq).expect("present");
                node.owners.release(&mut self.spill);
                gone
            }
        };
        if !gone.is_approximate() {
            self.workers.state_mut(slot).blocks -= 1;
        }
    }

    fn clear_worker(&mut self, slot: u32) {
        self.drop_holdings(slot);
        self.workers.state_mut(slot).engine_ids = FxHashMap::default();
    }

    /// Drops every holding of the slot: a full scan, as a worker's blocks are
    /// spread over the whole index.
    fn drop_holdings(&mut self, slot: u32) {
        let has_approximate = self.approx_expiry.keys().any(|(_, s)| *s == slot);
        if self.workers.state(slot).blocks == 0 && !has_approximate {
            return;
        }
        let spill = &mut self.spill;
        self.nodes
            .retain(|_, node| match node.owners.remove(spill, slot) {
                Removal::Emptied(_) => {
                    node.owners.release(spill);
                    false
                }
                _ => true,
            });
        self.approx_expiry.retain(|(_, s), _| *s != slot);
        self.workers.state_mut(slot).blocks = 0;
    }

    /// Keeps the index within `max_nodes`: past it, drops the least recently
    /// used tenth at once, so the O(n) selection is paid rarely.
    fn prune_if_needed(&mut self) {
        let Some(max_nodes) = self.max_nodes else {
            return;
        };
        if self.nodes.len() <= max_nodes {
            return;
        }
        let target = max_nodes - max_nodes / 10;
        let excess = self.nodes.len() - target;
        let now = self.clock.load(Ordering::Relaxed);
        let mut by_age: Vec<(u32, SeqHash)> = self
            .nodes
            .iter()
            .map(|(seq, node)| {
                (
                    now.wrapping_sub(node.last_access.load(Ordering::Relaxed)),
                    *seq,
                )
            })
            .collect();
        by_age.select_nth_unstable_by(excess - 1, |a, b| b.0.cmp(&a.0));
        for &(_, seq) in &by_age[..excess] {
            let node = self.nodes.remove(&seq).expect("listed above");
            for holding in node.owners.as_slice(&self.spill) {
                if holding.is_approximate() {
                    self.approx_expiry.remove(&(seq, holding.slot()));
                } else {
                    self.workers.state_mut(holding.slot()).blocks -= 1;
                }
            }
            node.owners.release(&mut self.spill);
        }
        self.pruned += excess as u64;
    }
}
