//! Dense slots for the workers an index knows, with each one's event stream
//! position and engine-id mapping.

use super::events::IndexError;
use super::holding::MAX_SLOTS;
use crate::ids::{EngineBlockId, SeqHash, WorkerId};
use rustc_hash::FxHashMap;

pub struct WorkerState {
    pub id: WorkerId,
    /// The last applied batch number; None before the first batch.
    pub last_seq: Option<u64>,
    /// Engine block ids that differ from the router's sequence hash. An engine
    /// that names blocks by the router's own hashes costs no entries here.
    pub engine_ids: FxHashMap<EngineBlockId, SeqHash>,
    /// Confirmed blocks held (approximate entries not counted).
    pub blocks: usize,
}

impl WorkerState {
    fn new(id: WorkerId) -> Self {
        WorkerState {
            id,
            last_seq: None,
            engine_ids: FxHashMap::default(),
            blocks: 0,
        }
    }

    /// The batch number this worker must send next.
    pub fn expected_seq(&self) -> u64 {
        self.last_seq.map_or(0, |s| s + 1)
    }

    /// The router's hash for an engine block id.
    pub fn seq_hash_of(&self, block: EngineBlockId) -> SeqHash {
        self.engine_ids
            .get(&block)
            .copied()
            .unwrap_or(SeqHash(block.0))
    }
}

#[derive(Default)]
pub struct WorkerTable {
    slots: Vec<Option<WorkerState>>,
    by_id: FxHashMap<WorkerId, u32>,
    free: Vec<u32>,
}

impl WorkerTable {
    pub fn slot_of(&self, id: WorkerId) -> Option<u32> {
        self.by_id.get(&id).copied()
    }

    pub fn get_or_insert(&mut self, id: WorkerId) -> Result<u32, IndexError> {
        if let Some(slot) = self.slot_of(id) {
            return Ok(slot);
        }
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(WorkerState::new(id));
                slot
            }
            None if self.slots.len() < MAX_SLOTS as usize => {
                self.slots.push(Some(WorkerState::new(id)));
                self.slots.len() as u32 - 1
            }
            None => return Err(IndexError::TooManyWorkers(MAX_SLOTS)),
        };
        self.by_id.insert(id, slot);
        Ok(slot)
    }

    /// Forgets a worker; the caller must already have dropped its holdings.
    pub fn remove(&mut self, id: WorkerId) -> Option<WorkerState> {
        let slot = self.by_id.remove(&id)?;
        self.free.push(slot);
        self.slots[slot as usize].take()
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

    pub fn iter(&self) -> impl Iterator<Item = (u32, &WorkerState)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(slot, state)| state.as_ref().map(|s| (slot as u32, s)))
    }
}
