//! The index's nodes: an arena in insertion order plus a hash table from
//! sequence hash to arena slot. Blocks stored by one event are pushed side by
//! side, so a lookup walking a cached sequence mostly finds the next block in
//! the next slot and skips the hash probe.
//!
//! The arena also names nodes by engine block ids: one shared name per node,
//! whichever worker gave it, in a second table keyed by the id. The name's
//! hash is a bijection of the id, split in two: the table entry's tag holds
//! its top half and the node's `name_checks` word its bottom half, so a name
//! costs 12 bytes and a bit, and is checked whole.

use super::owner_sets::SetId;
use super::slot_table::{prefetch, BlankTable, SlotTable};
use crate::ids::{EngineBlockId, SeqHash};
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};

/// 12 bytes: packed to 4-byte alignment, the sequence hash is read by value
/// (a reference to it would be unaligned), and a node costs a quarter less
/// than with the 4 bytes of padding a `u64` field's alignment would add.
#[repr(C, packed(4))]
pub struct Node {
    pub seq: SeqHash,
    /// `SetId::EMPTY` marks a hole left by a removed node.
    pub owners: SetId,
}

const _: () = assert!(std::mem::size_of::<Node>() == 12);

impl Node {
    pub fn is_live(&self) -> bool {
        self.owners != SetId::EMPTY
    }
}

/// Where compaction moved each node: its new index is the number of live
/// nodes before it. One bit per old index plus a count per 64, so that the
/// tables, read in hash order, look indices up in a few hundred kilobytes
/// that stay in cache rather than in an array as big as the arena.
pub struct Renumbering {
    live: Vec<u64>,
    before: Vec<u32>,
}

impl Renumbering {
    fn new(live: impl Iterator<Item = bool>) -> Self {
        let mut words = Vec::new();
        for (i, is_live) in live.enumerate() {
            if i % 64 == 0 {
                words.push(0u64);
            }
            if is_live {
                *words.last_mut().expect("pushed above") |= 1 << (i % 64);
            }
        }
        let mut count = 0u32;
        let before = words
            .iter()
            .map(|word| {
                let here = count;
                count += word.count_ones();
                here
            })
            .collect();
        Renumbering {
            live: words,
            before,
        }
    }

    /// The new index of old index `index`; None for a hole.
    pub fn get(&self, index: u32) -> Option<u32> {
        let (word, bit) = ((index / 64) as usize, index % 64);
        let bits = self.live[word];
        (bits >> bit & 1 == 1)
            .then(|| self.before[word] + (bits & ((1u64 << bit) - 1)).count_ones())
    }
}

/// Fewer holes than this are left alone: finding runs or compacting would
/// cost more than it gives. Lower in tests, so that small indexes reuse and
/// compact.
const MIN_HOLES: usize = if cfg!(test) { 16 } else { 1024 };

#[derive(Default)]
pub struct NodeArena {
    nodes: Vec<Node>,
    table: SlotTable,
    holes: usize,
    /// Runs of holes that new nodes fill before the arena grows, found by one
    /// scan once holes are an eighth of it: under churn a removed node's
    /// slot is reused without moving any node or rewriting the tables, and a
    /// stored event's blocks still land side by side within a run. The last
    /// run is filled first, from its start.
    reusable: Vec<Range<u32>>,
    /// Each node's logical time of the last lookup or store that touched it
    /// (atomics, so that lookups record it under a shared lock), kept only
    /// for an index that prunes the least recently used (`with_access_times`):
    /// an unbounded index neither stores nor writes it.
    last_access: Option<Vec<AtomicU32>>,
    /// Per node, the bottom half of its name's hash (see the module note);
    /// meaningful where `named` has the node's bit. Both are empty until an
    /// engine names a block by an id of its own.
    name_checks: Vec<u32>,
    named: Vec<u64>,
    by_name: SlotTable,
    /// Entries of `by_name` whose node went without the id being known (a
    /// prune, a cleared worker): left in place, as finding them would take
    /// a scan, and swept before a hole is reused.
    stale_names: usize,
    /// Homes both tables are given up front ([`NodeArena::reserve`]).
    reserved_homes: usize,
    /// While no engine names blocks: how many blocks the batch being
    /// applied stores, in all its slices, which a name table it makes is
    /// first sized for.
    names_expected: usize,
}

/// Something for each of the arena's two tables, the sequence table and
/// the name table; None for a table it does not concern.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PerTable<T> {
    pub sequence: Option<T>,
    pub names: Option<T>,
}

/// The tables a reservation remakes, by their log2 homes.
pub type Reservation = PerTable<u32>;

impl Reservation {
    pub fn remakes_nothing(&self) -> bool {
        self.sequence.is_none() && self.names.is_none()
    }

    /// The blank tables it takes; slow for big tables, so made under no lock.
    pub fn blanks(&self) -> PerTable<BlankTable> {
        PerTable {
            sequence: self.sequence.map(BlankTable::new_yielding),
            names: self.names.map(BlankTable::new_yielding),
        }
    }
}

/// The hash table's hash of a sequence hash: it is already uniformly random.
fn slot_hash(seq: SeqHash) -> u64 {
    seq.0
}

const NAME_MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

/// The multiplier's inverse modulo 2^64 (Newton's iteration doubles the
/// correct low bits each step; an odd number is its own inverse mod 8).
const NAME_MULTIPLIER_INVERSE: u64 = {
    let mut inverse = NAME_MULTIPLIER;
    let mut step = 0;
    while step < 5 {
        inverse = inverse.wrapping_mul(2u64.wrapping_sub(NAME_MULTIPLIER.wrapping_mul(inverse)));
        step += 1;
    }
    inverse
};

/// The hash of an engine id, which may be a counter rather than a hash: a
/// bijection, so that equal hashes mean equal ids.
#[inline]
fn name_hash(id: EngineBlockId) -> u64 {
    let x = id.0.wrapping_mul(NAME_MULTIPLIER);
    x ^ (x >> 29)
}

/// The id whose [`name_hash`] is `hash`.
pub(super) fn name_of_hash(hash: u64) -> EngineBlockId {
    let x = hash ^ (hash >> 29) ^ (hash >> 58);
    EngineBlockId(x.wrapping_mul(NAME_MULTIPLIER_INVERSE))
}

/// Whether bit `index` of a bitmap is set; bits past its end are not.
fn has_bit(words: &[u64], index: u32) -> bool {
    words
        .get(index as usize / 64)
        .is_some_and(|word| word >> (index % 64) & 1 == 1)
}

/// Sets or clears bit `index` of a bitmap, growing it as needed.
fn set_bit(words: &mut Vec<u64>, index: u32, value: bool) {
    let word = index as usize / 64;
    if word >= words.len() {
        words.resize(word + 1, 0);
    }
    let bit = 1u64 << (index % 64);
    if value {
        words[word] |= bit;
    } else {
        words[word] &= !bit;
    }
}

/// The bottom half of an id's hash, kept with its node.
fn name_check(id: EngineBlockId) -> u32 {
    name_hash(id) as u32
}

/// Whether node `index` is named `id`, given that the name table has an
/// entry of `index` under `id`'s tag. A free function, so that a table
/// update can call it while it borrows the table.
#[inline]
fn bears_name(checks: &[u32], named: &[u64], index: u32, id: EngineBlockId) -> bool {
    has_bit(named, index) && checks[index as usize] == name_check(id)
}

impl NodeArena {
    pub fn len(&self) -> usize {
        self.nodes.len() - self.holes
    }

    pub fn find(&self, seq: SeqHash) -> Option<u32> {
        let nodes = &self.nodes;
        self.table
            .find(slot_hash(seq), |i| { nodes[i as usize].seq } == seq)
    }

    /// An empty arena that records each node's last access, for an index
    /// that prunes the least recently used.
    pub fn with_access_times() -> Self {
        NodeArena {
            last_access: Some(Vec::new()),
            ..NodeArena::default()
        }
    }

    /// Node `index` was looked up or stored at `tick`.
    #[inline]
    pub fn touch(&self, index: u32, tick: u32) {
        if let Some(times) = &self.last_access {
            times[index as usize].store(tick, Ordering::Relaxed);
        }
    }

    /// The tick node `index` was last touched at; None when not tracked.
    pub fn last_access(&self, index: u32) -> Option<u32> {
        let times = self.last_access.as_ref()?;
        Some(times[index as usize].load(Ordering::Relaxed))
    }

    pub fn is_named(&self, index: u32) -> bool {
        has_bit(&self.named, index)
    }

    fn set_named(&mut self, index: u32, named: bool) {
        set_bit(&mut self.named, index, named);
    }

    #[inline]
    fn is_named_by(&self, index: u32, id: EngineBlockId) -> bool {
        bears_name(&self.name_checks, &self.named, index, id)
    }

    /// Starts loading what storing `seq` under engine id `block` will probe.
    #[inline]
    pub fn prefetch_store(&self, seq: SeqHash, block: EngineBlockId) {
        self.table.prefetch(slot_hash(seq));
        if block.0 != seq.0 {
            self.by_name.prefetch(name_hash(block));
        }
    }

    /// Starts loading the table line that finding the node of engine id
    /// `block` will probe first: the name table's once any engine names
    /// blocks by ids of its own, else the sequence table's (the id is the
    /// sequence hash).
    #[inline]
    pub fn prefetch_named(&self, block: EngineBlockId) {
        if !self.names_in_use() {
            self.table.prefetch(slot_hash(SeqHash(block.0)));
        } else {
            self.by_name.prefetch(name_hash(block));
        }
    }

    /// Starts loading the table line that removing the node `block` names
    /// will erase; its node was prefetched by
    /// [`NodeArena::prefetch_named_nodes`] a few blocks earlier.
    #[inline]
    pub fn prefetch_erase(&self, block: EngineBlockId) {
        if let Some(index) = self.by_name.candidate(name_hash(block)) {
            if self.is_named_by(index, block) {
                self.table
                    .prefetch(slot_hash(self.nodes[index as usize].seq));
            }
        }
    }

    /// Starts loading the nodes (and name checks) the table line, prefetched by
    /// [`NodeArena::prefetch_named`] a few blocks earlier, points `block`
    /// at; for an id that names no node, the sequence table's line instead.
    #[inline]
    pub fn prefetch_named_nodes(&self, block: EngineBlockId) {
        if let Some(index) = self.by_name.candidate(name_hash(block)) {
            prefetch(&self.name_checks[index as usize]);
            prefetch(&self.nodes[index as usize]);
        } else if let Some(index) = self.table.candidate(slot_hash(SeqHash(block.0))) {
            prefetch(&self.nodes[index as usize]);
        }
    }

    /// The node an engine named `id`.
    pub fn find_named(&self, id: EngineBlockId) -> Option<u32> {
        self.by_name
            .find(name_hash(id), |i| self.is_named_by(i, id))
    }

    /// Gives the sequence table at least `homes` homes, and the name table
    /// as many where an engine already names blocks by ids of its own (see
    /// [`SlotTable::reserve`]). A name table made later is made for the
    /// batch making it ([`NodeArena::names_under_reservation`]).
    pub fn reserve(&mut self, homes: usize) {
        self.reserved_homes = homes;
        self.table.reserve(homes);
        if self.names_in_use() {
            self.by_name.reserve(homes);
        }
    }

    pub fn names_in_use(&self) -> bool {
        !self.name_checks.is_empty()
    }

    /// The events about to be applied store `blocks` blocks (see
    /// `names_expected`).
    pub fn expect_names(&mut self, blocks: usize) {
        self.names_expected = blocks;
    }

    /// What [`NodeArena::reserve`] of `homes` would remake, by size: the
    /// part of a reservation that can be made ahead, under no lock.
    pub fn reservation(&self, homes: usize) -> Reservation {
        PerTable {
            sequence: self.table.resize_for(homes),
            names: self
                .names_in_use()
                .then(|| self.by_name.resize_for(homes))
                .flatten(),
        }
    }

    /// The tables [`NodeArena::reserve`] of `homes` would make, laid into
    /// `blanks`; lookups of the current ones may go on meanwhile. A blank
    /// no longer of the size the reservation takes is dropped.
    pub fn lay_reserved(&self, homes: usize, blanks: PerTable<BlankTable>) -> PerTable<SlotTable> {
        let lay = |table: &SlotTable, blank: BlankTable| table.laid_into(homes, blank);
        PerTable {
            sequence: blanks.sequence.and_then(|blank| lay(&self.table, blank)),
            names: blanks
                .names
                .filter(|_| self.names_in_use())
                .and_then(|blank| lay(&self.by_name, blank)),
        }
    }

    /// Puts `laid` in place of the tables it remade and records the
    /// reservation of `homes`; remakes nothing. Returns the tables it
    /// replaced, for the caller to free once it has let go of the index.
    pub fn install(&mut self, homes: usize, laid: PerTable<SlotTable>) -> PerTable<SlotTable> {
        let retired = PerTable {
            sequence: laid
                .sequence
                .map(|table| std::mem::replace(&mut self.table, table)),
            names: laid
                .names
                .map(|table| std::mem::replace(&mut self.by_name, table)),
        };
        self.reserved_homes = homes;
        self.table.keep_reserved(homes);
        if self.names_in_use() {
            self.by_name.keep_reserved(homes);
        }
        retired
    }

    /// The homes of the last reservation.
    pub fn reserved_homes(&self) -> usize {
        self.reserved_homes
    }

    /// Whether engines name blocks and the name table is smaller than the
    /// last reservation gives it: the table made with the first engine id
    /// is made for that batch (making a reserved one then would stall its
    /// apply) and is brought to size apart from it.
    pub fn names_under_reservation(&self) -> bool {
        self.names_in_use() && self.by_name.is_under(self.reserved_homes)
    }

    /// Names node `index` `id` unless it has another name or `id` names
    /// another node; returns whether `id` now names it.
    pub fn name(&mut self, index: u32, id: EngineBlockId) -> bool {
        if !self.names_in_use() {
            self.name_checks = vec![0; self.nodes.len()];
            // Room for the blocks of the events making it, up to the
            // reservation: a big first batch would otherwise double the
            // table once per power of two. The rest of the reservation is
            // made apart ([`NodeArena::names_under_reservation`]).
            let room = self.names_expected.saturating_mul(8) / 7;
            self.by_name.reserve(room.min(self.reserved_homes));
        }
        if self.is_named(index) {
            // `id` is its name if the bottom halves match and the node's
            // entry sits under `id`'s tag, the top half.
            return self.is_named_by(index, id)
                && self.by_name.find(name_hash(id), |i| i == index).is_some();
        }
        let (checks, named) = (&self.name_checks, &self.named);
        let is_id = |i: u32| bears_name(checks, named, i, id);
        if self
            .by_name
            .find_or_insert(name_hash(id), index, is_id)
            .is_some()
        {
            return false;
        }
        self.name_checks[index as usize] = name_check(id);
        self.set_named(index, true);
        true
    }

    /// Every named node's slot and name.
    pub fn names(&self) -> impl Iterator<Item = (u32, EngineBlockId)> + '_ {
        self.by_name
            .entries()
            .filter(|&(_, index)| self.is_named(index))
            .map(|(tag, index)| {
                let hash = u64::from(tag) << 32 | u64::from(self.name_checks[index as usize]);
                (index, name_of_hash(hash))
            })
    }

    /// The node of `seq`, trying the slot after `previous` before the table.
    #[inline]
    pub fn find_after(&self, previous: u32, seq: SeqHash) -> Option<u32> {
        let next = previous as usize + 1;
        match self.nodes.get(next) {
            Some(node) if { node.seq } == seq && node.is_live() => Some(next as u32),
            _ => self.find(seq),
        }
    }

    /// One past the highest arena index, holes included.
    pub fn slots(&self) -> u32 {
        self.nodes.len() as u32
    }

    pub fn node(&self, index: u32) -> &Node {
        &self.nodes[index as usize]
    }

    pub fn node_mut(&mut self, index: u32) -> &mut Node {
        &mut self.nodes[index as usize]
    }

    /// The node of `seq`, or, when there is none, a new one held by the
    /// set `owners()` gives; and whether it is new. One table probe.
    #[inline]
    pub fn find_or_insert(
        &mut self,
        seq: SeqHash,
        tick: u32,
        owners: impl FnOnce() -> SetId,
    ) -> (u32, bool) {
        let index = self
            .reusable
            .last()
            .map_or(self.nodes.len() as u32, |run| run.start);
        let nodes = &self.nodes;
        if let Some(found) =
            self.table
                .find_or_insert(slot_hash(seq), index, |i| { nodes[i as usize].seq } == seq)
        {
            return (found, false);
        }
        let owners = owners();
        debug_assert!(owners != SetId::EMPTY);
        let node = Node { seq, owners };
        if index as usize == self.nodes.len() {
            self.nodes.push(node);
            if self.names_in_use() {
                self.name_checks.push(0);
            }
            if let Some(times) = &mut self.last_access {
                times.push(AtomicU32::new(tick));
            }
            return (index, true);
        }
        debug_assert!(!self.nodes[index as usize].is_live());
        self.nodes[index as usize] = node;
        self.touch(index, tick);
        self.holes -= 1;
        let run = self.reusable.last_mut().expect("the slot came from a run");
        run.start += 1;
        if run.start == run.end {
            self.reusable.pop();
        }
        (index, true)
    }

    /// Removes a node and its name, leaving a hole; returns its owner set.
    /// `name` is the engine id it was found by, if it was: the name's entry
    /// is erased when that is its name, else left stale.
    pub fn remove(&mut self, index: u32, name: Option<EngineBlockId>) -> SetId {
        let seq = self.nodes[index as usize].seq;
        self.table.remove(slot_hash(seq), index);
        if self.is_named(index) {
            let erased = name.is_some_and(|id| {
                self.is_named_by(index, id) && self.by_name.remove(name_hash(id), index)
            });
            if !erased {
                self.stale_names += 1;
            }
            self.set_named(index, false);
        }
        self.holes += 1;
        std::mem::replace(&mut self.nodes[index as usize].owners, SetId::EMPTY)
    }

    /// Live nodes with their arena index.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| node.is_live())
            .map(|(i, node)| (i as u32, node))
    }

    /// Upkeep of the holes: once they are half the arena (the index shrank)
    /// squeezes them out, keeping the order (and so the adjacency of
    /// sequences) and renumbering the tables, and returns where each old
    /// index went; else, once the runs to reuse are used up and holes are an
    /// eighth of the arena (churn), finds the runs of holes to fill next.
    pub fn reclaim_holes(&mut self) -> Option<Renumbering> {
        if self.holes < MIN_HOLES {
            return None;
        }
        if self.holes * 2 >= self.nodes.len() {
            return Some(self.compact());
        }
        if self.reusable.is_empty() && self.holes * 8 >= self.nodes.len() {
            self.find_reusable_runs();
        }
        None
    }

    fn find_reusable_runs(&mut self) {
        if self.stale_names > 0 {
            let named = &self.named;
            self.by_name.remap(|i| has_bit(named, i).then_some(i));
            self.stale_names = 0;
        }
        let mut start = None;
        for (i, node) in self.nodes.iter().enumerate() {
            match (node.is_live(), start) {
                (false, None) => start = Some(i as u32),
                (true, Some(from)) => {
                    self.reusable.push(from..i as u32);
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(from) = start {
            self.reusable.push(from..self.nodes.len() as u32);
        }
    }

    fn compact(&mut self) -> Renumbering {
        self.reusable.clear();
        let remap = Renumbering::new(self.nodes.iter().map(Node::is_live));
        if self.names_in_use() {
            let mut live = self.nodes.iter().map(Node::is_live);
            self.name_checks.retain(|_| live.next() == Some(true));
            self.name_checks.shrink_to_fit();
            let mut named = Vec::new();
            for (new, (old, _)) in self.iter().enumerate() {
                if has_bit(&self.named, old) {
                    set_bit(&mut named, new as u32, true);
                }
            }
            self.named = named;
        }
        if let Some(times) = &mut self.last_access {
            let mut live = self.nodes.iter().map(Node::is_live);
            times.retain(|_| live.next() == Some(true));
            times.shrink_to_fit();
        }
        self.nodes.retain(Node::is_live);
        self.nodes.shrink_to_fit();
        self.holes = 0;
        self.table.remap(|i| remap.get(i));
        self.by_name.remap(|i| remap.get(i));
        if !self.names_in_use() {
            // No node is left to name: the next engine id starts a small
            // table, as the first did, rather than one of an old size.
            self.by_name = SlotTable::default();
        }
        self.stale_names = 0;
        remap
    }

    /// Bytes of the two hash tables, reserved room included.
    pub fn table_bytes(&self) -> usize {
        self.table.heap_bytes() + self.by_name.heap_bytes()
    }

    /// Bytes held by the arena and its tables.
    pub fn heap_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.table.heap_bytes()
            + self.name_checks.capacity() * std::mem::size_of::<u32>()
            + self.named.capacity() * std::mem::size_of::<u64>()
            + self.by_name.heap_bytes()
            + self.last_access.as_ref().map_or(0, |times| {
                times.capacity() * std::mem::size_of::<AtomicU32>()
            })
    }
}

#[cfg(test)]
mod tests {
    use super::{name_hash, name_of_hash, NodeArena, Renumbering};
    use crate::ids::{EngineBlockId, SeqHash};
    use crate::index::owner_sets::SetId;
    use proptest::prelude::*;

    #[test]
    fn a_name_left_behind_does_not_find_the_node_reusing_its_slot() {
        // Two ids whose hashes share their bottom half: the half a node keeps.
        let old = name_of_hash(1 << 32 | 7);
        let new = name_of_hash(2 << 32 | 7);
        let mut arena = NodeArena::default();
        let insert =
            |arena: &mut NodeArena, seq: u64| arena.find_or_insert(SeqHash(seq), 0, || SetId(1)).0;
        let slots: Vec<u32> = (1..=160).map(|seq| insert(&mut arena, seq)).collect();
        assert!(arena.name(slots[0], old));
        // Pruned, so without its id: the name's entry is left behind.
        for &slot in &slots[..32] {
            arena.remove(slot, None);
        }
        assert_eq!(
            arena.reclaim_holes().map(|_| ()),
            None,
            "runs found, no compaction"
        );
        let reused = (1000..1032)
            .map(|seq| insert(&mut arena, seq))
            .find(|&i| i == slots[0]);
        let reused = reused.expect("the named node's slot is reused");
        assert!(arena.name(reused, new));
        assert_eq!(arena.find_named(new), Some(reused));
        assert_eq!(arena.find_named(old), None);
    }

    proptest! {
        #[test]
        fn renumbering_counts_the_live_nodes_before(live in proptest::collection::vec(any::<bool>(), 0..300)) {
            let remap = Renumbering::new(live.iter().copied());
            let mut next = 0;
            for (i, &is_live) in live.iter().enumerate() {
                let expected = is_live.then_some(next);
                next += u32::from(is_live);
                prop_assert_eq!(remap.get(i as u32), expected);
            }
        }

        #[test]
        fn a_name_is_recovered_from_its_hash(id in any::<u64>()) {
            prop_assert_eq!(name_of_hash(name_hash(EngineBlockId(id))), EngineBlockId(id));
        }
    }
}
