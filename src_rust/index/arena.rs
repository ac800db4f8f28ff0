//! The index's nodes: an arena in insertion order plus a hash table from
//! sequence hash to arena slot. Blocks stored by one event are pushed side by
//! side, so a lookup walking a cached sequence mostly finds the next block in
//! the next slot and skips the hash probe.
//!
//! The arena also names nodes by engine block ids: one shared name per node,
//! whichever worker gave it, in a second table keyed by the id.

use super::owner_sets::SetId;
use super::slot_table::{prefetch, SlotTable};
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
    /// Each node's engine block id, where one differs from its sequence hash
    /// (a node whose entry equals its own hash has none). Empty until an
    /// engine names a block by an id of its own.
    names: Vec<u64>,
    by_name: SlotTable,
}

/// The hash table's hash of a sequence hash: it is already uniformly random.
fn slot_hash(seq: SeqHash) -> u64 {
    seq.0
}

/// The hash of an engine id, which may be a counter rather than a hash.
fn name_hash(id: EngineBlockId) -> u64 {
    let x = id.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 29)
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
        if self.names.is_empty() {
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
        for index in self.by_name.candidates(name_hash(block)) {
            let node = &self.nodes[index as usize];
            if self.names[index as usize] == block.0 {
                self.table.prefetch(slot_hash(node.seq));
            }
        }
    }

    /// Starts loading the nodes (and names) the table line, prefetched by
    /// [`NodeArena::prefetch_named`] a few blocks earlier, points `block`
    /// at; for an id that names no node, the sequence table's line instead.
    #[inline]
    pub fn prefetch_named_nodes(&self, block: EngineBlockId) {
        let mut named = false;
        for index in self.by_name.candidates(name_hash(block)) {
            prefetch(&self.names[index as usize]);
            prefetch(&self.nodes[index as usize]);
            named = true;
        }
        if named {
            return;
        }
        for index in self.table.candidates(slot_hash(SeqHash(block.0))) {
            prefetch(&self.nodes[index as usize]);
        }
    }

    /// The node an engine named `id`.
    pub fn find_named(&self, id: EngineBlockId) -> Option<u32> {
        let names = &self.names;
        self.by_name
            .find(name_hash(id), |i| names[i as usize] == id.0)
    }

    /// Names node `index` `id` unless it has another name or `id` names
    /// another node; returns whether `id` now names it.
    pub fn name(&mut self, index: u32, id: EngineBlockId) -> bool {
        if self.names.is_empty() {
            self.names = self.nodes.iter().map(|node| node.seq.0).collect();
        }
        let current = self.names[index as usize];
        if current == id.0 {
            return true;
        }
        if current != self.nodes[index as usize].seq.0 {
            return false;
        }
        let names = &self.names;
        if self
            .by_name
            .find_or_insert(name_hash(id), index, |i| names[i as usize] == id.0)
            .is_some()
        {
            return false;
        }
        self.names[index as usize] = id.0;
        true
    }

    /// The engine id that names node `index`, if one does.
    pub fn name_of(&self, index: u32) -> Option<EngineBlockId> {
        let name = *self.names.get(index as usize)?;
        (name != self.nodes[index as usize].seq.0).then_some(EngineBlockId(name))
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
            if !self.names.is_empty() {
                self.names.push(seq.0);
            }
            if let Some(times) = &mut self.last_access {
                times.push(AtomicU32::new(tick));
            }
            return (index, true);
        }
        debug_assert!(!self.nodes[index as usize].is_live());
        self.nodes[index as usize] = node;
        if !self.names.is_empty() {
            self.names[index as usize] = seq.0;
        }
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
    pub fn remove(&mut self, index: u32) -> SetId {
        let seq = self.nodes[index as usize].seq;
        self.table.remove(slot_hash(seq), index);
        if let Some(name) = self.name_of(index) {
            self.by_name.remove(name_hash(name), index);
            self.names[index as usize] = seq.0;
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
        if !self.names.is_empty() {
            let mut live = self.nodes.iter().map(Node::is_live);
            self.names.retain(|_| live.next() == Some(true));
            self.names.shrink_to_fit();
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
        remap
    }

    /// Bytes held by the arena and its tables.
    pub fn heap_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.table.heap_bytes()
            + self.names.capacity() * std::mem::size_of::<u64>()
            + self.by_name.heap_bytes()
            + self.last_access.as_ref().map_or(0, |times| {
                times.capacity() * std::mem::size_of::<AtomicU32>()
            })
    }
}

#[cfg(test)]
mod tests {
    use super::Renumbering;
    use proptest::prelude::*;

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
    }
}
