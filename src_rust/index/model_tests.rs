//! Property tests: random event streams against the obvious reference model,
//! a map from each prefix to the workers holding it.

use super::*;
use crate::hashing::chain_all;
use crate::ids::{EngineBlockId, LocalHash, Tier};
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};

type Prefix = Vec<u64>;

#[derive(Default)]
struct WorkerModel {
    next_seq: u64,
    /// The next id of an engine numbering its blocks with a counter.
    next_counter_id: u64,
    /// engine id -> (the block's whole prefix of local hashes, tier bits,
    /// whether it is through-only)
    blocks: BTreeMap<u64, (Prefix, u8, bool)>,
}

impl WorkerModel {
    fn id_of(&self, prefix: &[u64]) -> Option<u64> {
        self.blocks
            .iter()
            .find(|(_, (p, _, _))| p == prefix)
            .map(|(id, _)| *id)
    }
}

#[derive(Default)]
struct Model {
    workers: BTreeMap<u64, WorkerModel>,
    next_foreign_id: u64,
}

impl Model {
    /// Per worker: (device, host, disk) counts over its longest held prefix
    /// that ends at a block that is not through-only.
    fn matches(&self, query: &[u64]) -> BTreeMap<u64, (u32, u32, u32)> {
        let mut out = BTreeMap::new();
        for (worker, model) in &self.workers {
            let held: HashMap<&Prefix, (u8, bool)> = model
                .blocks
                .values()
                .map(|(p, t, through)| (p, (*t, *through)))
                .collect();
            let (mut walked, mut depths) = ((0, 0, 0), (0, 0, 0));
            for end in 1..=query.len() {
                let Some(&(bits, through)) = held.get(&query[..end].to_vec()) else {
                    break;
                };
                match bits.trailing_zeros() {
                    0 => walked.0 += 1,
                    1 => walked.1 += 1,
                    _ => walked.2 += 1,
                }
                if !through {
                    depths = walked;
                }
            }
            if depths != (0, 0, 0) {
                out.insert(*worker, depths);
            }
        }
        out
    }

    fn distinct_prefixes(&self) -> usize {
        let mut all: Vec<&Prefix> = self
            .workers
            .values()
            .flat_map(|w| w.blocks.values().map(|(p, _, _)| p))
            .collect();
        all.sort();
        all.dedup();
        all.len()
    }
}

/// How an engine names the blocks it stores.
#[derive(Copy, Clone, Debug)]
enum Ids {
    /// By the router's own sequence hashes.
    Router,
    /// By an id no other block of any worker has.
    Fresh,
    /// By a hash of the prefix that every worker computes alike (an engine
    /// with a fixed hash seed).
    Agreed,
    /// By a counter of its own, so that workers give one id to different
    /// blocks.
    Counter,
}

fn ids() -> impl Strategy<Value = Ids> {
    prop_oneof![
        Just(Ids::Router),
        Just(Ids::Fresh),
        Just(Ids::Agreed),
        Just(Ids::Counter)
    ]
}

#[derive(Clone, Debug)]
enum Op {
    Store {
        worker: u64,
        parent_pick: Option<usize>,
        locals: Vec<u64>,
        tier: u8,
        ids: Ids,
    },
    Remove {
        worker: u64,
        picks: Vec<usize>,
        tier: u8,
    },
    MarkEnds {
        worker: u64,
        picks: Vec<usize>,
        reusable: bool,
    },
    Clear {
        worker: u64,
    },
    RemoveWorker {
        worker: u64,
    },
    Duplicate {
        worker: u64,
    },
    Gap {
        worker: u64,
    },
    Reserve {
        blocks: usize,
    },
    ReserveInBackground {
        blocks: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let worker = 0u64..4;
    prop_oneof![
        6 => (worker.clone(), proptest::option::of(0usize..16), proptest::collection::vec(0u64..3, 1..4), 0u8..3, ids())
            .prop_map(|(worker, parent_pick, locals, tier, ids)| Op::Store { worker, parent_pick, locals, tier, ids }),
        3 => (worker.clone(), proptest::collection::vec(0usize..16, 1..3), 0u8..3)
            .prop_map(|(worker, picks, tier)| Op::Remove { worker, picks, tier }),
        3 => (worker.clone(), proptest::collection::vec(0usize..16, 1..4), any::<bool>())
            .prop_map(|(worker, picks, reusable)| Op::MarkEnds { worker, picks, reusable }),
        1 => worker.clone().prop_map(|worker| Op::Clear { worker }),
        1 => worker.clone().prop_map(|worker| Op::RemoveWorker { worker }),
        1 => worker.clone().prop_map(|worker| Op::Duplicate { worker }),
        1 => worker.prop_map(|worker| Op::Gap { worker }),
        1 => (0usize..64).prop_map(|blocks| Op::Reserve { blocks }),
        1 => (0usize..64).prop_map(|blocks| Op::ReserveInBackground { blocks }),
    ]
}

fn tier(bits: u8) -> Tier {
    Tier::from_index(bits).unwrap()
}

fn seq_of(prefix: &[u64]) -> SeqHash {
    let locals: Vec<LocalHash> = prefix.iter().copied().map(LocalHash).collect();
    *chain_all(None, &locals).last().unwrap()
}

/// Applies one op to both; returns the batch for the index, if any.
fn step(model: &mut Model, idx: &PrefixIndex, op: &Op) {
    match op {
        Op::Store {
            worker,
            parent_pick,
            locals,
            tier: t,
            ids,
        } => {
            let wm = model.workers.entry(*worker).or_default();
            let parent = parent_pick.and_then(|pick| {
                let n = wm.blocks.len();
                (n > 0).then(|| {
                    wm.blocks
                        .iter()
                        .nth(pick % n)
                        .map(|(id, (p, _, _))| (*id, p.clone()))
                        .unwrap()
                })
            });
            let mut prefix = parent.as_ref().map(|(_, p)| p.clone()).unwrap_or_default();
            let mut block_ids = Vec::new();
            for &local in locals {
                prefix.push(local);
                let id = match (wm.id_of(&prefix), ids) {
                    (Some(id), _) => id,
                    (None, Ids::Router) => seq_of(&prefix).0,
                    (None, Ids::Fresh) => {
                        model.next_foreign_id += 1;
                        (1 << 40) + model.next_foreign_id
                    }
                    (None, Ids::Agreed) => seq_of(&prefix).0 ^ 0x5555,
                    (None, Ids::Counter) => {
                        wm.next_counter_id += 1;
                        (1 << 41) + wm.next_counter_id
                    }
                };
                let entry = wm.blocks.entry(id).or_insert((prefix.clone(), 0, false));
                entry.1 |= 1 << t;
                block_ids.push(EngineBlockId(id));
            }
            let event = KvEvent::Stored {
                parent: parent.map(|(id, _)| EngineBlockId(id)),
                block_ids,
                content: BlockContent::LocalHashes(locals.iter().copied().map(LocalHash).collect()),
                tier: tier(*t),
                namespace_seed: 0,
            };
            send(wm, idx, *worker, vec![event]);
        }
        Op::Remove {
            worker,
            picks,
            tier: t,
        } => {
            let wm = model.workers.entry(*worker).or_default();
            let ids: Vec<u64> = wm.blocks.keys().copied().collect();
            let mut block_ids = Vec::new();
            for pick in picks {
                let id = if ids.is_empty() {
                    12345
                } else {
                    ids[pick % ids.len()]
                };
                if let Some(entry) = wm.blocks.get_mut(&id) {
                    entry.1 &= !(1 << t);
                    if entry.1 == 0 {
                        wm.blocks.remove(&id);
                    }
                }
                block_ids.push(EngineBlockId(id));
            }
            let event = KvEvent::Removed {
                block_ids,
                tier: tier(*t),
            };
            let wm = model.workers.get_mut(worker).unwrap();
            let batch = EventBatch {
                worker: WorkerId(*worker),
                seq: wm.next_seq,
                events: vec![event],
            };
            assert_eq!(idx.apply(&batch, false).unwrap().status, SeqStatus::Applied);
            wm.next_seq += 1;
        }
        Op::MarkEnds {
            worker,
            picks,
            reusable,
        } => {
            let Some(wm) = model
                .workers
                .get_mut(worker)
                .filter(|wm| !wm.blocks.is_empty())
            else {
                return;
            };
            let ids: Vec<u64> = wm.blocks.keys().copied().collect();
            let mut block_ids = Vec::new();
            for pick in picks {
                let id = ids[pick % ids.len()];
                wm.blocks.get_mut(&id).unwrap().2 = !reusable;
                block_ids.push(EngineBlockId(id));
            }
            let event = KvEvent::EndsReusable {
                block_ids,
                reusable: *reusable,
            };
            send(wm, idx, *worker, vec![event]);
        }
        Op::Clear { worker } => {
            let wm = model.workers.entry(*worker).or_default();
            wm.blocks.clear();
            send(wm, idx, *worker, vec![KvEvent::Cleared]);
        }
        Op::RemoveWorker { worker } => {
            let result = idx.remove_worker(WorkerId(*worker));
            match model.workers.remove(worker) {
                Some(wm) => assert_eq!(result.unwrap(), idx_blocks_of(&wm)),
                None => assert_eq!(result, Err(IndexError::UnknownWorker(WorkerId(*worker)))),
            }
        }
        Op::Duplicate { worker } => {
            if let Some(wm) = model.workers.get(worker).filter(|wm| wm.next_seq > 0) {
                let batch = EventBatch {
                    worker: WorkerId(*worker),
                    seq: wm.next_seq - 1,
                    events: vec![KvEvent::Cleared],
                };
                assert_eq!(
                    idx.apply(&batch, true).unwrap().status,
                    SeqStatus::Duplicate
                );
            }
        }
        Op::Gap { worker } => {
            let expected = model.workers.get(worker).map_or(0, |wm| wm.next_seq);
            let batch = EventBatch {
                worker: WorkerId(*worker),
                seq: expected + 1,
                events: vec![KvEvent::Cleared],
            };
            assert_eq!(
                idx.apply(&batch, true).unwrap().status,
                SeqStatus::Gap { expected }
            );
        }
        Op::Reserve { blocks } => idx.reserve(*blocks),
        Op::ReserveInBackground { blocks } => idx.reserve_in_background(*blocks),
    }
}

fn idx_blocks_of(wm: &WorkerModel) -> usize {
    wm.blocks.len()
}

fn send(wm: &mut WorkerModel, idx: &PrefixIndex, worker: u64, events: Vec<KvEvent>) {
    let batch = EventBatch {
        worker: WorkerId(worker),
        seq: wm.next_seq,
        events,
    };
    assert_eq!(idx.apply(&batch, true).unwrap().status, SeqStatus::Applied);
    wm.next_seq += 1;
}

fn check(model: &Model, idx: &PrefixIndex, queries: &[Prefix]) {
    for query in queries {
        let locals: Vec<LocalHash> = query.iter().copied().map(LocalHash).collect();
        let found: BTreeMap<u64, (u32, u32, u32)> = idx
            .find_matches(&chain_all(None, &locals), false)
            .scores
            .into_iter()
            .map(|(w, d)| (w.0, (d.device, d.host, d.disk)))
            .collect();
        assert_eq!(found, model.matches(query), "query {query:?}");
    }
    assert_eq!(idx.stats().blocks, model.distinct_prefixes());
    for info in idx.workers() {
        assert_eq!(info.blocks, model.workers[&info.worker.0].blocks.len());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn index_matches_the_reference_model(ops in proptest::collection::vec(op(), 1..40)) {
        let idx = PrefixIndex::new(IndexConfig { block_size: 4, max_nodes: None });
        let mut model = Model::default();
        let mut queries: Vec<Prefix> = vec![vec![0, 1, 2], vec![1, 1, 1, 1]];
        for op in &ops {
            step(&mut model, &idx, op);
            for wm in model.workers.values() {
                for (prefix, _, _) in wm.blocks.values() {
                    let mut longer = prefix.clone();
                    longer.push(0);
                    queries.push(longer);
                }
            }
            queries.sort();
            queries.dedup();
            check(&model, &idx, &queries);
        }
        let (restored, _) = PrefixIndex::restore(&idx.snapshot(SnapshotMarks::default())).unwrap();
        check(&model, &restored, &queries);
    }
}
