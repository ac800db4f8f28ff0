//! Dense slots for the workers an index knows, with each one's event stream
//! position and engine-id mapping.

use super::arena::Renumbering;
use super::events::IndexError;
use super::holding::MAX_SLOTS;
use crate::ids::{EngineBlockId, WorkerId};
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

pub struct WorkerState {
    pub id: WorkerId,
    /// The last applied batch number; None before the first batch.
    pub last_seq: Option<u64>,
    /// Arena index of each block this worker names by an engine id that the
    /// arena's shared names cannot hold (the node has another name, or the
    /// id names another node). Engines that agree on block ids, or name
    /// blocks by the router's own hashes, cost no entries here. An index may
    /// point at a hole (the block was pruned) until the arena is compacted,
    /// which drops such entries.
    pub engine_ids: FxHashMap<EngineKey, u32>,
    /// Confirmed blocks held (approximate entries not counted).
    pub blocks: usize,
    /// Which of the table's insertions made this state: a worker removed and
    /// added again is a new incarnation in a slot that may be the same.
    pub incarnation: u64,
}

impl WorkerState {
    fn new(id: WorkerId, incarnation: u64) -> Self {
        WorkerState {
            id,
            last_seq: None,
            engine_ids: FxHashMap::default(),
            blocks: 0,
            incarnation,
        }
    }

    /// The batch number this worker must send next.
    pub fn expected_seq(&self) -> u64 {
        self.last_seq.map_or(0, |s| s + 1)
    }

    /// The arena index recorded for an engine block id, if it is mapped.
    pub fn mapped_node(&self, block: EngineBlockId) -> Option<u32> {
        if self.engine_ids.is_empty() {
            return None;
        }
        self.engine_ids.get(&EngineKey::from(block)).copied()
    }
}

#[derive(Default)]
pub struct WorkerTable {
    slots: Vec<Option<WorkerState>>,
    by_id: FxHashMap<WorkerId, u32>,
    free: Vec<u32>,
    insertions: u64,
}

impl WorkerTable {
    pub fn slot_of(&self, id: WorkerId) -> Option<u32> {
        self.by_id.get(&id).copied()
    }

    pub fn get_or_insert(&mut self, id: WorkerId) -> Result<u32, IndexError> {
        if let Some(slot) = self.slot_of(id) {
            return Ok(slot);
        }
        let state = WorkerState::new(id, self.insertions);
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
        self.insertions += 1;
        self.by_id.insert(id, slot);
        Ok(slot)
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
            if !state.engine_ids.is_empty() {
                state.engine_ids.retain(|_, index| is_live(*index));
            }
        }
    }

    /// Rewrites every worker's mapped arena indices after a compaction.
    pub fn remap_nodes(&mut self, remap: &Renumbering) {
        for state in self.slots.iter_mut().flatten() {
            state.engine_ids.retain(|_, index| match remap.get(*index) {
                Some(new) => {
                    *index = new;
                    true
                }
                None => false,
            });
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, &WorkerState)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(slot, state)| state.as_ref().map(|s| (slot as u32, s)))
    }
}
