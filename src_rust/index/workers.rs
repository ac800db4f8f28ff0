//! Dense slots for the workers an index knows, with each one's event stream
//! position and engine-id mapping.

use super::arena::Renumbering;
use super::events::IndexError;
use super::holding::MAX_SLOTS;
use crate::ids::{EngineBlockId, SeqHash, WorkerId};
use rustc_hash::FxHashMap;
use std::hash::{Hash, Hasher};

/// An engine block id stored as two u32 halves, so that a map entry with a
/// u32 value packs into 12 bytes instead of 16.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct EngineKey([u32; 2]);

impl From<EngineBlockId> for EngineKey {
    fn from(block: EngineBlockId) -> Self {
        EngineKey([block.0 as u32, (block.0 >> 32) as u32])
    }
}

impl From<EngineKey> for EngineBlockId {
    fn from(key: EngineKey) -> Self {
        EngineBlockId(key.0[0] as u64 | (key.0[1] as u64) << 32)
    }
}

impl Hash for EngineKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        EngineBlockId::from(*self).0.hash(state);
    }
}

/// The blocks a worker names by engine ids that the arena's shared names
/// cannot hold (the node has another name, or the id names another node).
/// Engines that agree on block ids, or name blocks by the router's own
/// hashes, cost no entries here.
#[derive(Default)]
pub struct OwnNames {
    /// Arena index of each such id's node.
    nodes: FxHashMap<EngineKey, u32>,
    /// How many of those ids name each node. The worker's id for such a
    /// node is its own, so another name of the node (its shared name or its
    /// hash), which may equal some other id of this worker's, is not it.
    per_node: FxHashMap<u32, u32>,
}

impl OwnNames {
    pub fn get(&self, block: EngineBlockId) -> Option<u32> {
        if self.nodes.is_empty() {
            return None;
        }
        self.nodes.get(&EngineKey::from(block)).copied()
    }

    /// Whether some id of the worker's own names node `index`.
    pub fn names(&self, index: u32) -> bool {
        !self.per_node.is_empty() && self.per_node.contains_key(&index)
    }

    pub fn insert(&mut self, block: EngineBlockId, index: u32) {
        if let Some(old) = self.nodes.insert(block.into(), index) {
            self.uncount(old);
        }
        *self.per_node.entry(index).or_default() += 1;
    }

    /// Makes `seq`, the node's hash, the worker's own name for node
    /// `index`, unless an id of its own names it already.
    pub fn keep_hash_as_name(&mut self, seq: SeqHash, index: u32) {
        if !self.names(index) {
            self.insert(EngineBlockId(seq.0), index);
        }
    }

    pub fn remove(&mut self, block: EngineBlockId) {
        if self.nodes.is_empty() {
            return;
        }
        if let Some(old) = self.nodes.remove(&block.into()) {
            self.uncount(old);
        }
    }

    /// Keeps each entry whose node `renumber` maps (to its new index).
    pub fn renumber(&mut self, renumber: impl Fn(u32) -> Option<u32>) {
        if self.nodes.is_empty() {
            return;
        }
        self.nodes.retain(|_, index| match renumber(*index) {
            Some(new) => {
                *index = new;
                true
            }
            None => false,
        });
        self.per_node.clear();
        for &index in self.nodes.values() {
            *self.per_node.entry(index).or_default() += 1;
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (EngineBlockId, u32)> + '_ {
        self.nodes
            .iter()
            .map(|(key, index)| ((*key).into(), *index))
    }

    fn uncount(&mut self, index: u32) {
        if let Some(count) = self.per_node.get_mut(&index) {
            *count -= 1;
            if *count == 0 {
                self.per_node.remove(&index);
            }
        }
    }
}

pub struct WorkerState {
    pub id: WorkerId,
    /// The last applied batch number; None before the first batch.
    pub last_seq: Option<u64>,
    pub engine_ids: OwnNames,
    /// Confirmed blocks held (approximate entries not counted).
    pub blocks: usize,
    /// Which of the table's incarnations this state is: a worker removed
    /// and added again, or resynced, is a new one, in a slot that may be
    /// the same.
    pub incarnation: u64,
}

impl WorkerState {
    fn new(id: WorkerId, incarnation: u64) -> Self {
        WorkerState {
            id,
            last_seq: None,
            engine_ids: OwnNames::default(),
            blocks: 0,
            incarnation,
        }
    }

    /// The batch number this worker must send next.
    pub fn expected_seq(&self) -> u64 {
        self.last_seq.map_or(0, |s| s + 1)
    }
}

#[derive(Default)]
pub struct WorkerTable {
    slots: Vec<Option<WorkerState>>,
    by_id: FxHashMap<WorkerId, u32>,
    free: Vec<u32>,
    incarnations: u64,
}

impl WorkerTable {
    pub fn slot_of(&self, id: WorkerId) -> Option<u32> {
        self.by_id.get(&id).copied()
    }

    pub fn get_or_insert(&mut self, id: WorkerId) -> Result<u32, IndexError> {
        if let Some(slot) = self.slot_of(id) {
            return Ok(slot);
        }
        let state = WorkerState::new(id, self.incarnations);
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(state);
                slot
            }
            None if self.slots.len() < MAX_SLOTS as usize => {
                self.slots.push(Some(state));
                self.slots.len() as u32 - 1
            }
            None => return Err(IndexError::TooManyWorkers(MAX_SLOTS)),
        };
        self.incarnations += 1;
        self.by_id.insert(id, slot);
        Ok(slot)
    }

    /// Makes the worker in `slot` a new incarnation, keeping its state.
    pub fn renew(&mut self, slot: u32) -> u64 {
        let incarnation = self.incarnations;
        self.incarnations += 1;
        self.slots[slot as usize]
            .as_mut()
            .expect("a live worker slot")
            .incarnation = incarnation;
        incarnation
    }

    /// Forgets a worker; the caller must already have dropped its holdings.
    pub fn remove(&mut self, id: WorkerId) -> Option<WorkerState> {
        let slot = self.by_id.remove(&id)?;
        self.free.push(slot);
        self.slots[slot as usize].take()
    }

    /// The live state in `slot` if it is still `incarnation`'s.
    pub fn incarnation(&self, slot: u32, incarnation: u64) -> Option<&WorkerState> {
        self.slots
            .get(slot as usize)?
            .as_ref()
            .filter(|state| state.incarnation == incarnation)
    }

    pub fn state(&self, slot: u32) -> &WorkerState {
        self.slots[slot as usize]
            .as_ref()
            .expect("a holding points at a live worker slot")
    }

    pub fn state_mut(&mut self, slot: u32) -> &mut WorkerState {
        self.slots[slot as usize]
            .as_mut()
            .expect("a holding points at a live worker slot")
    }

    /// One past the highest slot in use, for sizing per-slot scratch arrays.
    pub fn slot_bound(&self) -> usize {
        self.slots.len()
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Drops the workers' own engine ids of nodes that are gone, before the
    /// arena reuses their slots.
    pub fn forget_removed_nodes(&mut self, is_live: impl Fn(u32) -> bool) {
        for state in self.slots.iter_mut().flatten() {
            state
                .engine_ids
                .renumber(|index| is_live(index).then_some(index));
        }
    }

    /// Rewrites every worker's mapped arena indices after a compaction.
    pub fn remap_nodes(&mut self, remap: &Renumbering) {
        for state in self.slots.iter_mut().flatten() {
            state.engine_ids.renumber(|index| remap.get(index));
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, &WorkerState)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(slot, state)| state.as_ref().map(|s| (slot as u32, s)))
    }
}
