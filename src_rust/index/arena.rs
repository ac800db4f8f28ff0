//! The index's nodes: an arena in insertion order plus a hash table from
//! sequence hash to arena slot. Blocks stored by one event are pushed side by
//! side, so a lookup walking a cached sequence mostly finds the next block in
//! the next slot and skips the hash probe.

use super::owner_sets::SetId;
use crate::ids::SeqHash;
use hashbrown::HashTable;
use std::sync::atomic::{AtomicU32, Ordering};

pub struct Node {
    pub seq: SeqHash,
    /// `SetId::EMPTY` marks a hole left by a removed node.
    pub owners: SetId,
    /// Logical time of the last lookup or store that touched this block; an
    /// atomic so that lookups can record it under a shared lock.
    last_access: AtomicU32,
}

impl Node {
    pub fn touch(&self, tick: u32) {
        self.last_access.store(tick, Ordering::Relaxed);
    }

    pub fn last_access(&self) -> u32 {
        self.last_access.load(Ordering::Relaxed)
    }

    pub fn is_live(&self) -> bool {
        self.owners != SetId::EMPTY
    }
}

#[derive(Default)]
pub struct NodeArena {
    nodes: Vec<Node>,
    table: HashTable<u32>,
    holes: usize,
}

/// The hash table's hash of a sequence hash: it is already uniformly random.
fn slot_hash(seq: SeqHash) -> u64 {
    seq.0
}

impl NodeArena {
    pub fn len(&self) -> usize {
        self.nodes.len() - self.holes
    }

    pub fn find(&self, seq: SeqHash) -> Option<u32> {
        let nodes = &self.nodes;
        self.table
            .find(slot_hash(seq), |&i| nodes[i as usize].seq == seq)
            .copied()
    }

    /// The node of `seq`, trying the slot after `previous` before the table.
    #[inline]
    pub fn find_after(&self, previous: u32, seq: SeqHash) -> Option<u32> {
        let next = previous as usize + 1;
        match self.nodes.get(next) {
            Some(node) if node.seq == seq && node.is_live() => Some(next as u32),
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

    /// Adds a node for a `seq` not yet present.
    pub fn insert(&mut self, seq: SeqHash, owners: SetId, tick: u32) -> u32 {
        debug_assert!(owners != SetId::EMPTY);
        let index = self.nodes.len() as u32;
        self.nodes.push(Node {
            seq,
            owners,
            last_access: AtomicU32::new(tick),
        });
        let nodes = &self.nodes;
        self.table
            .insert_unique(slot_hash(seq), index, |&i| slot_hash(nodes[i as usize].seq));
        index
    }

    /// Removes a node, leaving a hole; returns its owner set.
    pub fn remove(&mut self, index: u32) -> SetId {
        let seq = self.nodes[index as usize].seq;
        if let Ok(entry) = self.table.find_entry(slot_hash(seq), |&i| i == index) {
            entry.remove();
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

    /// Squeezes out the holes once they are a third of the arena, keeping
    /// the order (and so the adjacency of sequences) and rebuilding the
    /// table at a fitting size. Returns, when it compacted, each old index's
    /// new index (None for a hole).
    pub fn compact_if_sparse(&mut self) -> Option<Vec<Option<u32>>> {
        if self.holes < 1024 || self.holes * 3 < self.nodes.len() {
            return None;
        }
        let mut next = 0u32;
        let remap = self
            .nodes
            .iter()
            .map(|node| {
                node.is_live().then(|| {
                    next += 1;
                    next - 1
                })
            })
            .collect();
        self.nodes.retain(Node::is_live);
        self.nodes.shrink_to_fit();
        self.holes = 0;
        let mut table = HashTable::with_capacity(self.nodes.len());
        for (i, node) in self.nodes.iter().enumerate() {
            let nodes = &self.nodes;
            table.insert_unique(slot_hash(node.seq), i as u32, |&j| {
                slot_hash(nodes[j as usize].seq)
            });
        }
        self.table = table;
        Some(remap)
    }

    /// Bytes held by the arena and its table.
    pub fn heap_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.table.capacity() * (std::mem::size_of::<u32>() + 1)
    }
}
