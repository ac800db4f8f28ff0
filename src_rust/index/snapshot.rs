//! Dump and load of the confirmed index, with each worker's stream position,
//! so a restarted router resumes instead of rebuilding. Approximate entries
//! are predictions with a short life and are not kept. Nodes are written in
//! arena order, which keeps stored sequences adjacent after a load.

use super::events::IndexError;
use super::holding::{Holding, TierSet};
use super::tree::PrefixTree;
use crate::ids::{EngineBlockId, SeqHash, WorkerId};
use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 8] = b"KVRIDX02";

#[derive(Serialize, Deserialize)]
struct Snapshot {
    block_size: u64,
    max_nodes: Option<u64>,
    workers: Vec<WorkerRecord>,
    nodes: Vec<NodeRecord>,
}

#[derive(Serialize, Deserialize)]
struct WorkerRecord {
    id: u64,
    last_seq: Option<u64>,
    engine_ids: Vec<(u64, u64)>,
}

#[derive(Serialize, Deserialize)]
struct NodeRecord {
    seq_hash: u64,
    /// (position in `workers`, tier bits)
    holders: Vec<(u32, u8)>,
}

impl PrefixTree {
    pub fn to_snapshot(&self) -> Vec<u8> {
        let mut position = vec![u32::MAX; self.workers.slot_bound()];
        let workers = self
            .workers
            .iter()
            .enumerate()
            .map(|(pos, (slot, state))| {
                position[slot as usize] = pos as u32;
                WorkerRecord {
                    id: state.id.0,
                    last_seq: state.last_seq,
                    engine_ids: state
                        .engine_ids
                        .iter()
                        .map(|(key, index)| (EngineBlockId::from(*key).0, self.arena.node(*index)))
                        .filter(|(_, node)| node.is_live())
                        .map(|(engine, node)| (engine, node.seq.0))
                        .collect(),
                }
            })
            .collect();
        let nodes = self
            .arena
            .iter()
            .filter_map(|(_, node)| {
                let holders: Vec<(u32, u8)> = self
                    .sets
                    .holdings(node.owners)
                    .iter()
                    .filter(|h| !h.is_approximate())
                    .map(|h| (position[h.slot() as usize], h.tiers().bits()))
                    .collect();
                (!holders.is_empty()).then_some(NodeRecord {
                    seq_hash: node.seq.0,
                    holders,
                })
            })
            .collect();
        let snapshot = Snapshot {
            block_size: self.block_size as u64,
            max_nodes: self.max_nodes.map(|m| m as u64),
            workers,
            nodes,
        };
        let mut bytes = MAGIC.to_vec();
        bincode::serialize_into(&mut bytes, &snapshot).expect("serializing to memory cannot fail");
        bytes
    }

    pub fn from_snapshot(bytes: &[u8]) -> Result<PrefixTree, IndexError> {
        let bad = |why: String| IndexError::BadSnapshot(why);
        let body = bytes
            .strip_prefix(MAGIC.as_slice())
            .ok_or_else(|| bad("not a kvrouter index snapshot (wrong magic or version)".into()))?;
        let snapshot: Snapshot = bincode::deserialize(body).map_err(|e| bad(e.to_string()))?;
        if snapshot.block_size == 0 {
            return Err(bad("block_size is 0".into()));
        }
        let mut tree = PrefixTree::new(
            snapshot.block_size as usize,
            snapshot.max_nodes.map(|m| m as usize),
        );
        let mut slots = Vec::with_capacity(snapshot.workers.len());
        for record in &snapshot.workers {
            let slot = tree.workers.get_or_insert(WorkerId(record.id))?;
            tree.workers.state_mut(slot).last_seq = record.last_seq;
            slots.push(slot);
        }
        for record in snapshot.nodes {
            if record.holders.is_empty() {
                return Err(bad("a block has no holders".into()));
            }
            for (pos, bits) in record.holders {
                let slot = *slots
                    .get(pos as usize)
                    .ok_or_else(|| bad(format!("holder {pos} is not a listed worker")))?;
                let tiers = TierSet::from_bits(bits);
                if tiers.is_empty() {
                    return Err(bad("a holder has no tier".into()));
                }
                tree.restore_holding(SeqHash(record.seq_hash), Holding::confirmed(slot, tiers));
            }
        }
        for (record, &slot) in snapshot.workers.iter().zip(&slots) {
            for &(engine, seq) in &record.engine_ids {
                if let Some(index) = tree.arena.find(SeqHash(seq)) {
                    let block = EngineBlockId(engine);
                    tree.workers
                        .state_mut(slot)
                        .engine_ids
                        .insert(block.into(), index);
                }
            }
        }
        Ok(tree)
    }
}
