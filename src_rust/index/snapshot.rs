//! Dump and load of the confirmed index, with each worker's stream position,
//! so a restarted router resumes instead of rebuilding. Approximate entries
//! are predictions with a short life and are not kept. Nodes are written in
//! arena order, which keeps stored sequences adjacent after a load. The
//! bytes are sealed with a length and a checksum (snapshot_frame.rs).

use super::events::IndexError;
use super::holding::{Holding, TierSet};
use super::snapshot_frame;
use super::tree::PrefixTree;
use crate::ids::{EngineBlockId, SeqHash, WorkerId};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

/// Counters the index's owner keeps with the index, covered by the same
/// checksum: where in an event stream the snapshot stands (a replica's
/// JetStream position) and the next worker id the registry may assign.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotMarks {
    pub stream_position: u64,
    pub next_worker_id: u64,
}

#[derive(Serialize, Deserialize)]
struct Snapshot {
    marks: SnapshotMarks,
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

/// A holder's bit, beside its tier bits, for a through-only block.
const THROUGH_ONLY: u8 = 1 << 3;

fn holder_bits(holding: Holding) -> u8 {
    let through = if holding.is_through_only() {
        THROUGH_ONLY
    } else {
        0
    };
    holding.tiers().bits() | through
}

#[derive(Serialize, Deserialize)]
struct NodeRecord {
    seq_hash: u64,
    /// (position in `workers`, tier bits with THROUGH_ONLY)
    holders: Vec<(u32, u8)>,
}

impl PrefixTree {
    pub fn to_snapshot(&self, marks: SnapshotMarks) -> Vec<u8> {
        let mut position = vec![u32::MAX; self.workers.slot_bound()];
        let mut workers: Vec<WorkerRecord> = self
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
                        .map(|(block, index)| (block.0, self.arena.node(index)))
                        .filter(|(_, node)| node.is_live())
                        .map(|(engine, node)| (engine, node.seq.0))
                        .collect(),
                }
            })
            .collect();
        let names: FxHashMap<u32, EngineBlockId> = self.arena.names().collect();
        let mut nodes = Vec::new();
        for (index, node) in self.arena.iter() {
            let holders: Vec<(u32, u8)> = self
                .sets
                .holdings(node.owners)
                .iter()
                .filter(|h| !h.is_approximate())
                .map(|h| (position[h.slot() as usize], holder_bits(*h)))
                .collect();
            if holders.is_empty() {
                continue;
            }
            // A shared name is listed under every worker holding the node.
            if let Some(name) = names.get(&index) {
                for &(pos, _) in &holders {
                    workers[pos as usize].engine_ids.push((name.0, node.seq.0));
                }
            }
            nodes.push(NodeRecord {
                seq_hash: node.seq.0,
                holders,
            });
        }
        let snapshot = Snapshot {
            marks,
            block_size: self.block_size as u64,
            max_nodes: self.max_nodes.map(|m| m as u64),
            workers,
            nodes,
        };
        let body = bincode::serialize(&snapshot).expect("serializing to memory cannot fail");
        snapshot_frame::seal(&body)
    }

    pub fn from_snapshot(bytes: &[u8]) -> Result<(PrefixTree, SnapshotMarks), IndexError> {
        let bad = |why: String| IndexError::BadSnapshot(why);
        let body = snapshot_frame::open(bytes).map_err(bad)?;
        let snapshot: Snapshot =
            bincode::deserialize(body).map_err(|e| bad(format!("undecodable body: {e}")))?;
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
                let holding =
                    Holding::confirmed(slot, tiers).through_only(bits & THROUGH_ONLY != 0);
                tree.restore_holding(SeqHash(record.seq_hash), holding);
            }
        }
        for (record, &slot) in snapshot.workers.iter().zip(&slots) {
            for &(engine, seq) in &record.engine_ids {
                if let Some(index) = tree.arena.find(SeqHash(seq)) {
                    tree.name_block(slot, EngineBlockId(engine), index);
                }
            }
        }
        Ok((tree, snapshot.marks))
    }
}
