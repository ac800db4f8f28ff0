//! The prefix index itself, single-threaded; `PrefixIndex` wraps it in a lock.
//! See README.md next to this file for the layout and its trade-offs.

use super::arena::NodeArena;
use super::events::{ApplyOutcome, BlockContent, EventBatch, IndexError, KvEvent, SeqStatus};
use super::holding::{Holding, TierSet};
use super::overlap::{OverlapScores, TierDepths};
use super::owner_sets::{OwnerSets, SetId};
use super::workers::{OwnNames, WorkerTable};
use crate::hashing::{chain_all, BlockHasher};
use crate::ids::{EngineBlockId, SeqHash, Tier, WorkerId};
use rustc_hash::FxHashMap;
use std::borrow::{Borrow, Cow};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU32, Ordering};

/// How many blocks ahead an event's loop starts loading the table lines it
/// will probe: enough to cover a memory access with the work of the blocks
/// in between.
const PREFETCH_AHEAD: usize = 8;

/// The most blocks of capacity [`PrefixTree::reserve`] gives homes to:
/// tables of 2^24 homes, 128 MiB each. A larger index grows its tables as
/// it fills.
pub const MAX_RESERVED_BLOCKS: usize = 1 << 24;

pub struct PrefixTree {
    pub(crate) block_size: usize,
    pub(crate) max_nodes: Option<usize>,
    pub(crate) arena: NodeArena,
    pub(crate) sets: OwnerSets,
    pub(crate) workers: WorkerTable,
    clock: AtomicU32,
    pruned: u64,
    /// The authoritative expiry (ms) of each approximate holding.
    approx_expiry: FxHashMap<(SeqHash, u32), u64>,
    /// Expiries in time order; an entry is stale when `approx_expiry` disagrees.
    approx_queue: BinaryHeap<Reverse<(u64, SeqHash, u32)>>,
    /// Set once any block is marked through-only: until then lookups skip
    /// the checks for it.
    ends_marked: bool,
}

/// Where a started batch's events go: the worker's slot, as long as it is
/// the incarnation the batch started on.
#[derive(Copy, Clone, Debug)]
pub struct ApplyTarget {
    slot: u32,
    incarnation: u64,
    /// The blocks the whole batch stores, which a name table made by any
    /// of its slices is first sized for.
    stored_blocks: usize,
}

/// The blocks `events` store.
fn stored_blocks<E: Borrow<KvEvent>>(events: &[E]) -> usize {
    events
        .iter()
        .map(|e| match e.borrow() {
            KvEvent::Stored { block_ids, .. } => block_ids.len(),
            _ => 0,
        })
        .sum()
}

/// What [`PrefixTree::start_apply`] found.
pub enum Started {
    /// Nothing to apply: a duplicate or a gap.
    Done(ApplyOutcome),
    Apply(ApplyTarget),
}

/// A worker still matching during a lookup, with the tier run it is in,
/// and whether its blocks are through-only since the last end a prefix
/// could stop at (whose depths [`Ends`] keeps).
struct Matching {
    slot: u32,
    tier: Tier,
    through: bool,
    run_start: u32,
    depths: TierDepths,
}

/// The depths at their last reusable end of the workers in a through-only
/// run: out of [`Matching`], which stays small, as only hybrid engines'
/// blocks are ever through-only.
#[derive(Default)]
struct Ends(Vec<(u32, TierDepths)>);

impl Ends {
    fn take(&mut self, slot: u32) -> TierDepths {
        let at = self.0.iter().position(|(s, _)| *s == slot);
        at.map_or_else(TierDepths::default, |at| self.0.swap_remove(at).1)
    }
}

impl Matching {
    fn new<const ENDS: bool>(holding: Holding, ends: &mut Ends) -> Self {
        let through = ENDS && holding.is_through_only();
        if through {
            ends.0.push((holding.slot(), TierDepths::default()));
        }
        Matching {
            slot: holding.slot(),
            tier: holding.tiers().best(),
            through,
            run_start: 0,
            depths: TierDepths::default(),
        }
    }

    fn close_run(&mut self, end: u32) {
        self.depths.add_many(self.tier, end - self.run_start);
        self.run_start = end;
    }

    /// From block `at` on, the worker holds blocks as `holding` does.
    fn follow<const ENDS: bool>(&mut self, holding: Holding, at: u32, ends: &mut Ends) {
        let tier = holding.tiers().best();
        if tier != self.tier {
            self.close_run(at);
            self.tier = tier;
        }
        if ENDS && holding.is_through_only() != self.through {
            self.through = !self.through;
            if self.through {
                self.close_run(at);
                ends.0.push((self.slot, self.depths));
            } else {
                ends.take(self.slot);
            }
        }
    }

    /// Adds the worker's reusable prefix to `done`, once its match ended at
    /// block `end`; nothing when it has none.
    fn finish<const ENDS: bool>(
        &mut self,
        end: u32,
        ends: &mut Ends,
        done: &mut Vec<(u32, TierDepths)>,
    ) {
        self.close_run(end);
        if !ENDS || !self.through {
            // It held the first block at least.
            done.push((self.slot, self.depths));
            return;
        }
        let depths = ends.take(self.slot);
        if depths.total() > 0 {
            done.push((self.slot, depths));
        }
    }
}

impl PrefixTree {
    pub fn new(block_size: usize, max_nodes: Option<usize>) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        PrefixTree {
            block_size,
            max_nodes,
            arena: if max_nodes.is_some() {
                NodeArena::with_access_times()
            } else {
                NodeArena::default()
            },
            sets: OwnerSets::default(),
            workers: WorkerTable::default(),
            clock: AtomicU32::new(0),
            pruned: 0,
            approx_expiry: FxHashMap::default(),
            approx_queue: BinaryHeap::new(),
            ends_marked: false,
        }
    }

    /// The logical time of a lookup or store, for pruning the least
    /// recently used; an unbounded index, which records no access, skips
    /// the shared counter (a contended line under concurrent lookups).
    fn tick(&self) -> u32 {
        if self.max_nodes.is_none() {
            return 0;
        }
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// Applies one batch if it is the worker's next; see [`SeqStatus`].
    /// With `strict`, a removal of a block the worker does not hold, or a
    /// parent it does not hold, rejects the whole batch unapplied.
    pub fn apply<E: Borrow<KvEvent>>(
        &mut self,
        batch: &EventBatch<E>,
        strict: bool,
    ) -> Result<ApplyOutcome, IndexError> {
        match self.start_apply(batch, strict)? {
            Started::Done(outcome) => Ok(outcome),
            Started::Apply(target) => Ok(self.apply_all(target, batch)),
        }
    }

    /// Replaces everything known about the worker with `batch` (a full dump
    /// of its cache), and continues its stream after `batch.seq`.
    pub fn resync<E: Borrow<KvEvent>>(
        &mut self,
        batch: &EventBatch<E>,
    ) -> Result<ApplyOutcome, IndexError> {
        let target = self.start_resync(batch)?;
        Ok(self.apply_all(target, batch))
    }

    fn apply_all<E: Borrow<KvEvent>>(
        &mut self,
        target: ApplyTarget,
        batch: &EventBatch<E>,
    ) -> ApplyOutcome {
        let outcome = self.apply_events(target, &batch.events);
        self.finish_apply(target, batch.seq);
        outcome
    }

    /// The first half of [`PrefixTree::apply`]: checks the batch's shape and
    /// number. Its events then go in with [`PrefixTree::apply_slice`] and
    /// [`PrefixTree::finish_apply`], which a caller may spread over several
    /// lock holds.
    pub fn start_apply<E: Borrow<KvEvent>>(
        &mut self,
        batch: &EventBatch<E>,
        strict: bool,
    ) -> Result<Started, IndexError> {
        self.validate_shape(&batch.events)?;
        let existing = self.workers.slot_of(batch.worker);
        let expected = existing.map_or(0, |slot| self.workers.state(slot).expected_seq());
        if batch.seq < expected {
            return Ok(Started::Done(ApplyOutcome::with_status(
                SeqStatus::Duplicate,
            )));
        }
        if batch.seq > expected {
            return Ok(Started::Done(ApplyOutcome::with_status(SeqStatus::Gap {
                expected,
            })));
        }
        if strict {
            self.validate_known(batch.worker, existing, &batch.events)?;
        }
        let slot = self.workers.get_or_insert(batch.worker)?;
        Ok(Started::Apply(ApplyTarget {
            slot,
            incarnation: self.workers.state(slot).incarnation,
            stored_blocks: stored_blocks(&batch.events),
        }))
    }

    /// The first half of [`PrefixTree::resync`]: checks the dump's shape and
    /// forgets what the worker held.
    pub fn start_resync<E: Borrow<KvEvent>>(
        &mut self,
        batch: &EventBatch<E>,
    ) -> Result<ApplyTarget, IndexError> {
        self.validate_shape(&batch.events)?;
        let slot = self.workers.get_or_insert(batch.worker)?;
        self.clear_worker(slot);
        // A batch of the worker's still being applied in slices, from its
        // stream before the dump, gets no more of its events and does not
        // set the stream's position.
        Ok(ApplyTarget {
            slot,
            incarnation: self.workers.renew(slot),
            stored_blocks: stored_blocks(&batch.events),
        })
    }

    /// Applies some of a started batch's events; None, and nothing applied,
    /// once the worker was removed or resynced since the batch started.
    pub fn apply_slice<E: Borrow<KvEvent>>(
        &mut self,
        target: ApplyTarget,
        events: &[E],
    ) -> Option<ApplyOutcome> {
        self.workers
            .incarnation(target.slot, target.incarnation)
            .is_some()
            .then(|| self.apply_events(target, events))
    }

    /// Records the started batch as applied, and keeps the index in bounds.
    pub fn finish_apply(&mut self, target: ApplyTarget, seq: u64) {
        if self
            .workers
            .incarnation(target.slot, target.incarnation)
            .is_some()
        {
            self.workers.state_mut(target.slot).last_seq = Some(seq);
        }
        self.maintain();
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
        self.maintain();
        Ok(blocks)
    }

    /// Per worker, the length of the longest cached prefix of `seq_hashes`.
    /// With `early_exit`, stops once a single worker is left matching.
    pub fn find_matches(&self, seq_hashes: &[SeqHash], early_exit: bool) -> OverlapScores {
        if self.ends_marked {
            self.find::<true>(seq_hashes, early_exit)
        } else {
            self.find::<false>(seq_hashes, early_exit)
        }
    }

    /// [`PrefixTree::find_matches`], with through-only blocks read (`ENDS`)
    /// or known to be none.
    fn find<const ENDS: bool>(&self, seq_hashes: &[SeqHash], early_exit: bool) -> OverlapScores {
        let tick = self.tick();
        let mut matching: Vec<Matching> = Vec::new();
        let mut done: Vec<(u32, TierDepths)> = Vec::new();
        let mut ends = Ends::default();
        let mut current_set = SetId::EMPTY;
        let mut previous: Option<u32> = None;
        let mut matched = 0u32;
        for (i, &seq) in seq_hashes.iter().enumerate() {
            let i = i as u32;
            let found = match previous {
                Some(prev) => self.arena.find_after(prev, seq),
                None => self.arena.find(seq),
            };
            let Some(index) = found else {
                break;
            };
            self.arena.touch(index, tick);
            let node = self.arena.node(index);
            if node.owners != current_set {
                let holdings = self.sets.holdings(node.owners);
                if i == 0 {
                    matching = holdings
                        .iter()
                        .map(|&h| Matching::new::<ENDS>(h, &mut ends))
                        .collect();
                } else {
                    matching.retain_mut(|m| {
                        match holdings.binary_search_by_key(&m.slot, |h| h.slot()) {
                            Ok(j) => {
                                m.follow::<ENDS>(holdings[j], i, &mut ends);
                                true
                            }
                            Err(_) => {
                                m.finish::<ENDS>(i, &mut ends, &mut done);
                                false
                            }
                        }
                    });
                }
                current_set = node.owners;
            }
            if matching.is_empty() {
                break;
            }
            matched = i + 1;
            previous = Some(index);
            if early_exit && matching.len() == 1 {
                break;
            }
        }
        for mut m in matching {
            m.finish::<ENDS>(matched, &mut ends, &mut done);
        }
        done.sort_unstable_by_key(|(slot, _)| *slot);
        let scores = done
            .into_iter()
            .map(|(slot, depths)| (self.workers.state(slot).id, depths))
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
            if self
                .holding_of(seq, slot)
                .is_some_and(|held| !held.is_approximate())
            {
                continue;
            }
            self.put_holding(seq, Holding::approximate(slot), tick);
            self.approx_expiry.insert((seq, slot), expiry_ms);
            self.approx_queue.push(Reverse((expiry_ms, seq, slot)));
        }
        self.maintain();
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
            if self
                .holding_of(seq, slot)
                .is_some_and(Holding::is_approximate)
            {
                self.drop_holding(seq, slot);
            }
        }
        self.maintain();
    }

    pub fn num_nodes(&self) -> usize {
        self.arena.len()
    }

    /// Sizes the tables for workers that can hold `capacity_blocks` blocks
    /// together: one home per block, so that applying their events does
    /// not double a table until more than 7/8 of those blocks are distinct
    /// (a block several workers hold is one node). At most the bound, if
    /// any, and [`MAX_RESERVED_BLOCKS`]: the homes are paid for in memory
    /// whether or not the blocks come, and a table sized for every block
    /// at 7/8 full would be up to twice as big as the index needs where
    /// workers share prefixes. A name table the first engine id makes
    /// later is made for its batch; [`super::PrefixIndex`] brings it to this size.
    pub fn reserve(&mut self, capacity_blocks: usize) {
        self.arena.reserve(self.homes_for(capacity_blocks));
    }

    /// The homes [`PrefixTree::reserve`] gives each table for workers that
    /// can hold `capacity_blocks` blocks together.
    pub fn homes_for(&self, capacity_blocks: usize) -> usize {
        let limit = self.max_nodes.unwrap_or(usize::MAX);
        capacity_blocks.min(limit).min(MAX_RESERVED_BLOCKS)
    }

    pub fn num_approximate(&self) -> usize {
        self.approx_expiry.len()
    }

    pub fn pruned_total(&self) -> u64 {
        self.pruned
    }

    /// The node a worker's engine block id names: the worker's own mapping,
    /// the node the id names for every worker, or the node whose sequence
    /// hash is the id itself; but not, by those two, a node the worker names
    /// by an id of its own (the id is then another worker's name for it).
    pub(super) fn node_of_block(&self, slot: u32, block: EngineBlockId) -> Option<u32> {
        let own = &self.workers.state(slot).engine_ids;
        match own.get(block) {
            Some(index) => self.arena.node(index).is_live().then_some(index),
            None => self
                .arena
                .find_named(block)
                .or_else(|| self.arena.find(SeqHash(block.0)))
                .filter(|&index| !own.names(index)),
        }
    }

    /// The sequence hash a stored event's parent id stands for. An unmapped
    /// id is taken as the router's own hash even when the node is gone, so an
    /// engine using the router's hashes keeps chaining after a prune.
    fn parent_seq(&self, slot: u32, parent: EngineBlockId) -> SeqHash {
        let own = &self.workers.state(slot).engine_ids;
        let shared = || {
            self.arena
                .find_named(parent)
                .filter(|&index| !own.names(index))
        };
        match own.get(parent).or_else(shared) {
            Some(index) => self.arena.node(index).seq,
            None => SeqHash(parent.0),
        }
    }

    /// Records that the worker calls node `index` `block`: as the node's
    /// shared name where it can be, else in the worker's own map.
    pub(super) fn name_block(&mut self, slot: u32, block: EngineBlockId, index: u32) {
        let was_named = self.arena.is_named(index);
        if self.arena.name(index, block) {
            self.forget_own_name(slot, block);
            if !was_named {
                self.keep_hashes_as_own_names(index, block, slot);
            }
            return;
        }
        self.workers.state_mut(slot).engine_ids.insert(block, index);
        // `block` is another node's name. If the worker holds that node by
        // its hash, that hash becomes its own name for it, so that once the
        // worker's `block` is removed, a second removal of it does not reach
        // the other node.
        if let Some(other) = self.arena.find_named(block).filter(|&other| other != index) {
            let node = self.arena.node(other);
            let held = self.sets.get(node.owners, slot).is_some();
            if held {
                let own = &mut self.workers.state_mut(slot).engine_ids;
                own.keep_hash_as_name(node.seq, other);
            }
        }
    }

    /// Node `index` has just been given the shared name `block` by worker
    /// `namer`. Another worker holding it by its hash, for which `block` is
    /// its own id for another node, keeps the hash as its own name for this
    /// one: once that worker's `block` is removed, a second removal of it
    /// must not reach this node by the shared name.
    fn keep_hashes_as_own_names(&mut self, index: u32, block: EngineBlockId, namer: u32) {
        let node = self.arena.node(index);
        for holding in self.sets.holdings(node.owners) {
            if holding.slot() == namer {
                continue;
            }
            let own = &mut self.workers.state_mut(holding.slot()).engine_ids;
            if own.get(block).is_some() {
                own.keep_hash_as_name(node.seq, index);
            }
        }
    }

    fn forget_own_name(&mut self, slot: u32, block: EngineBlockId) {
        self.workers.state_mut(slot).engine_ids.remove(block);
    }

    fn holding_of(&self, seq: SeqHash, slot: u32) -> Option<Holding> {
        let index = self.arena.find(seq)?;
        self.sets.get(self.arena.node(index).owners, slot)
    }

    /// Sets the worker's holding of `seq`, creating the node if needed;
    /// returns the holding it replaced.
    fn put_holding(&mut self, seq: SeqHash, holding: Holding, tick: u32) -> Option<Holding> {
        self.update_holding(seq, holding.slot(), tick, |_| holding)
            .1
    }

    /// Sets the worker's holding of `seq` to `next(previous holding)`,
    /// creating the node if needed; returns the node's arena index and the
    /// previous holding.
    fn update_holding(
        &mut self,
        seq: SeqHash,
        slot: u32,
        tick: u32,
        next: impl Fn(Option<Holding>) -> Holding,
    ) -> (u32, Option<Holding>) {
        let sets = &mut self.sets;
        let (index, inserted) = self.arena.find_or_insert(seq, tick, || {
            let set = sets.with(SetId::EMPTY, next(None));
            sets.acquire(set);
            set
        });
        if inserted {
            return (index, None);
        }
        self.arena.touch(index, tick);
        let old = self.arena.node(index).owners;
        let previous = self.sets.get(old, slot);
        let holding = next(previous);
        debug_assert_eq!(holding.slot(), slot);
        if previous != Some(holding) {
            let new = self.sets.with(old, holding);
            self.sets.replace(old, new);
            self.arena.node_mut(index).owners = new;
        }
        (index, previous)
    }

    /// Removes the worker's holding of `seq`, dropping the node when it was
    /// the last; keeps the worker's block count.
    fn drop_holding(&mut self, seq: SeqHash, slot: u32) -> Option<Holding> {
        let index = self.arena.find(seq)?;
        self.drop_holding_at(index, slot, None)
    }

    /// [`PrefixTree::drop_holding`] for a node already found, by engine id
    /// `name` if it was.
    fn drop_holding_at(
        &mut self,
        index: u32,
        slot: u32,
        name: Option<EngineBlockId>,
    ) -> Option<Holding> {
        let old = self.arena.node(index).owners;
        let previous = self.sets.get(old, slot)?;
        self.unlink(index, old, slot, name);
        if !previous.is_approximate() {
            self.workers.state_mut(slot).blocks -= 1;
        }
        Some(previous)
    }

    /// Moves node `index` from owner set `old` to `old` without `slot`;
    /// `name` is the engine id it was found by, if it was.
    fn unlink(&mut self, index: u32, old: SetId, slot: u32, name: Option<EngineBlockId>) {
        let new = self.sets.without(old, slot);
        if new == SetId::EMPTY {
            self.arena.remove(index, name);
            self.sets.release(old);
        } else {
            self.sets.replace(old, new);
            self.arena.node_mut(index).owners = new;
        }
    }

    fn apply_events<E: Borrow<KvEvent>>(
        &mut self,
        target: ApplyTarget,
        events: &[E],
    ) -> ApplyOutcome {
        let slot = target.slot;
        if !self.arena.names_in_use() {
            self.arena.expect_names(target.stored_blocks);
        }
        let tick = self.tick();
        let mut outcome = ApplyOutcome::with_status(SeqStatus::Applied);
        for event in events.iter().map(Borrow::borrow) {
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
                    let prev = parent.map(|p| self.parent_seq(slot, p));
                    if let Some(index) = prev.and_then(|seq| self.arena.find(seq)) {
                        self.arena.touch(index, tick);
                    }
                    let seqs = chain_all(prev, &locals);
                    for (i, (&block, &seq)) in block_ids.iter().zip(&seqs).enumerate() {
                        if let (Some(&seq), Some(&block)) = (
                            seqs.get(i + PREFETCH_AHEAD),
                            block_ids.get(i + PREFETCH_AHEAD),
                        ) {
                            self.arena.prefetch_store(seq, block);
                        }
                        self.store_block(slot, block, seq, *tier, tick);
                    }
                    outcome.blocks_stored += block_ids.len();
                }
                KvEvent::Removed { block_ids, tier } => {
                    for (i, &block) in block_ids.iter().enumerate() {
                        if let Some(&block) = block_ids.get(i + PREFETCH_AHEAD) {
                            self.arena.prefetch_named(block);
                        }
                        if let Some(&block) = block_ids.get(i + PREFETCH_AHEAD / 2) {
                            self.arena.prefetch_named_nodes(block);
                        }
                        if let Some(&block) = block_ids.get(i + PREFETCH_AHEAD / 4) {
                            self.arena.prefetch_erase(block);
                        }
                        if self.remove_block(slot, block, *tier) {
                            outcome.blocks_removed += 1;
                        } else {
                            outcome.unknown_removals += 1;
                        }
                    }
                }
                KvEvent::EndsReusable {
                    block_ids,
                    reusable,
                } => {
                    for &block in block_ids {
                        self.mark_end(slot, block, *reusable);
                    }
                }
                KvEvent::Cleared => self.clear_worker(slot),
            }
        }
        outcome
    }

    /// Marks a block the worker holds (confirmed) as an end a reused prefix
    /// may stop at, or not; a block it does not hold is left alone.
    fn mark_end(&mut self, slot: u32, block: EngineBlockId, reusable: bool) {
        let Some(index) = self.node_of_block(slot, block) else {
            return;
        };
        let node = self.arena.node(index);
        let (seq, held) = (node.seq, self.sets.get(node.owners, slot));
        if let Some(held) = held.filter(|held| !held.is_approximate()) {
            self.ends_marked |= !reusable;
            self.put_holding(seq, held.through_only(!reusable), self.tick());
        }
    }

    fn store_block(
        &mut self,
        slot: u32,
        block: EngineBlockId,
        seq: SeqHash,
        tier: Tier,
        tick: u32,
    ) {
        let (index, previous) = self.update_holding(seq, slot, tick, |previous| match previous {
            Some(held) if !held.is_approximate() => {
                Holding::confirmed(slot, held.tiers().with(tier))
                    .through_only(held.is_through_only())
            }
            _ => Holding::confirmed(slot, TierSet::only(tier)),
        });
        if block.0 != seq.0 {
            self.name_block(slot, block, index);
        } else if self.arena.is_named(index) {
            // Another engine's name for the node may be one of this worker's
            // ids for another block; its hash, kept as its own name, keeps a
            // removal of that id from reaching this node.
            self.workers.state_mut(slot).engine_ids.insert(block, index);
        }
        match previous {
            None => self.workers.state_mut(slot).blocks += 1,
            Some(held) if held.is_approximate() => {
                self.workers.state_mut(slot).blocks += 1;
                self.approx_expiry.remove(&(seq, slot));
            }
            Some(_) => {}
        }
    }

    /// Returns whether the worker held the block in that tier.
    fn remove_block(&mut self, slot: u32, block: EngineBlockId, tier: Tier) -> bool {
        let Some(index) = self.node_of_block(slot, block) else {
            self.forget_own_name(slot, block);
            return false;
        };
        let node = self.arena.node(index);
        let (seq, owners) = (node.seq, node.owners);
        let held = self
            .sets
            .get(owners, slot)
            .filter(|held| !held.is_approximate() && held.tiers().contains(tier));
        let Some(held) = held else {
            return false;
        };
        let remaining = held.tiers().without(tier);
        if remaining.is_empty() {
            self.forget_own_name(slot, block);
            self.drop_holding_at(index, slot, Some(block));
        } else {
            let kept = Holding::confirmed(slot, remaining).through_only(held.is_through_only());
            self.put_holding(seq, kept, self.tick());
        }
        true
    }

    fn clear_worker(&mut self, slot: u32) {
        self.drop_holdings(slot);
        self.workers.state_mut(slot).engine_ids = OwnNames::default();
    }

    /// Drops every holding of the slot: a full scan, as a worker's blocks are
    /// spread over the whole index.
    fn drop_holdings(&mut self, slot: u32) {
        let has_approximate = self.approx_expiry.keys().any(|(_, s)| *s == slot);
        if self.workers.state(slot).blocks == 0 && !has_approximate {
            return;
        }
        for index in 0..self.arena.slots() {
            let node = self.arena.node(index);
            if node.is_live() && self.sets.get(node.owners, slot).is_some() {
                let old = node.owners;
                self.unlink(index, old, slot, None);
            }
        }
        self.approx_expiry.retain(|(_, s), _| *s != slot);
        self.workers.state_mut(slot).blocks = 0;
    }

    /// Upkeep after every write: the node bound, then squeezing the arena
    /// and freeing unused owner sets when they pile up.
    fn maintain(&mut self) {
        self.prune_if_needed();
        if let Some(remap) = self.arena.reclaim_holes() {
            self.workers.remap_nodes(&remap);
        }
        self.sets.collect_garbage();
    }

    /// Keeps the index within `max_nodes`: past it, drops the least recently
    /// used tenth at once, so the O(n) selection is paid rarely.
    fn prune_if_needed(&mut self) {
        let Some(max_nodes) = self.max_nodes else {
            return;
        };
        if self.arena.len() <= max_nodes {
            return;
        }
        let target = max_nodes - max_nodes / 10;
        let excess = self.arena.len() - target;
        let now = self.clock.load(Ordering::Relaxed);
        let mut by_age: Vec<(u32, u32)> = self
            .arena
            .iter()
            .map(|(index, _)| {
                let touched = self
                    .arena
                    .last_access(index)
                    .expect("a bounded index tracks it");
                (now.wrapping_sub(touched), index)
            })
            .collect();
        by_age.select_nth_unstable_by(excess - 1, |a, b| b.0.cmp(&a.0));
        for &(_, index) in &by_age[..excess] {
            let seq = self.arena.node(index).seq;
            let owners = self.arena.remove(index, None);
            for holding in self.sets.holdings(owners) {
                if holding.is_approximate() {
                    self.approx_expiry.remove(&(seq, holding.slot()));
                } else {
                    self.workers.state_mut(holding.slot()).blocks -= 1;
                }
            }
            self.sets.release(owners);
        }
        let arena = &self.arena;
        self.workers
            .forget_removed_nodes(|index| arena.node(index).is_live());
        self.pruned += excess as u64;
    }

    /// Adds one confirmed holding read from a snapshot.
    pub(crate) fn restore_holding(&mut self, seq: SeqHash, holding: Holding) {
        self.ends_marked |= holding.is_through_only();
        if self.put_holding(seq, holding, 0).is_none() {
            self.workers.state_mut(holding.slot()).blocks += 1;
        }
    }

    /// Bytes of the node arena and its table, for memory accounting.
    pub fn node_heap_bytes(&self) -> usize {
        self.arena.heap_bytes()
    }

    /// Bytes of the hash tables, reserved room included.
    pub fn table_bytes(&self) -> usize {
        self.arena.table_bytes()
    }
}
