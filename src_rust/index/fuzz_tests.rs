//! Adversarial property tests: arbitrary, mostly invalid event batches, in
//! lenient and strict mode, never panic and never break the index's
//! invariants.

use super::*;
use crate::ids::{EngineBlockId, LocalHash, Tier};
use proptest::prelude::*;

fn tier() -> impl Strategy<Value = Tier> {
    (0u8..3).prop_map(|t| Tier::from_index(t).unwrap())
}

/// Ids from a small pool, so that parents and removals sometimes hit.
fn block_id() -> impl Strategy<Value = EngineBlockId> {
    prop_oneof![
        (0u64..24).prop_map(EngineBlockId),
        any::<u64>().prop_map(EngineBlockId)
    ]
}

fn event() -> impl Strategy<Value = KvEvent> {
    prop_oneof![
        4 => (
            proptest::option::of(block_id()),
            proptest::collection::vec(block_id(), 0..5),
            prop_oneof![
                proptest::collection::vec(0u32..4, 0..20).prop_map(BlockContent::Tokens),
                proptest::collection::vec((0u64..6).prop_map(LocalHash), 0..5)
                    .prop_map(BlockContent::LocalHashes),
            ],
            tier(),
        )
            .prop_map(|(parent, block_ids, content, tier)| KvEvent::Stored {
                parent,
                block_ids,
                content,
                tier,
                namespace_seed: 0,
            }),
        2 => (proptest::collection::vec(block_id(), 0..5), tier())
            .prop_map(|(block_ids, tier)| KvEvent::Removed { block_ids, tier }),
        1 => Just(KvEvent::Cleared),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    Apply {
        worker: u64,
        seq_offset: i8,
        events: Vec<KvEvent>,
        strict: bool,
    },
    Resync {
        worker: u64,
        events: Vec<KvEvent>,
    },
    RemoveWorker(u64),
    Approximate(u64, Vec<u64>),
    Query(Vec<u64>, bool),
}

fn op() -> impl Strategy<Value = Op> {
    let events = || proptest::collection::vec(event(), 0..4);
    prop_oneof![
        6 => (0u64..4, -1i8..3, events(), any::<bool>()).prop_map(
            |(worker, seq_offset, events, strict)| Op::Apply { worker, seq_offset, events, strict }
        ),
        1 => (0u64..4, events()).prop_map(|(worker, events)| Op::Resync { worker, events }),
        1 => (0u64..5).prop_map(Op::RemoveWorker),
        1 => (0u64..4, proptest::collection::vec(0u64..30, 0..6))
            .prop_map(|(worker, hashes)| Op::Approximate(worker, hashes)),
        2 => (proptest::collection::vec(0u64..30, 0..8), any::<bool>())
            .prop_map(|(hashes, early)| Op::Query(hashes, early)),
    ]
}

/// What must hold after any sequence of calls.
fn check_invariants(tree: &PrefixTree) {
    let mut confirmed = vec![0usize; tree.workers.slot_bound()];
    let mut live = 0;
    for (_, node) in tree.arena.iter() {
        live += 1;
        let holdings = tree.sets.holdings(node.owners);
        assert!(!holdings.is_empty(), "a live node has holders");
        assert!(holdings.windows(2).all(|w| w[0].slot() < w[1].slot()));
        for h in holdings {
            assert!(!h.tiers().is_empty());
            if !h.is_approximate() {
                confirmed[h.slot() as usize] += 1;
            }
        }
    }
    assert_eq!(live, tree.num_nodes());
    for (slot, state) in tree.workers.iter() {
        assert_eq!(state.blocks, confirmed[slot as usize], "{}", state.id);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_calls_keep_the_index_consistent(ops in proptest::collection::vec(op(), 1..30)) {
        let mut tree = PrefixTree::new(4, Some(24));
        let mut now = 0u64;
        for op in ops {
            now += 7;
            match op {
                Op::Apply { worker, seq_offset, events, strict } => {
                    let next = tree
                        .workers
                        .slot_of(WorkerId(worker))
                        .map_or(0, |slot| tree.workers.state(slot).expected_seq());
                    let seq = next.saturating_add_signed(i64::from(seq_offset));
                    let before = tree.num_nodes();
                    let batch = EventBatch { worker: WorkerId(worker), seq, events };
                    match tree.apply(&batch, strict) {
                        Ok(outcome) if outcome.status != SeqStatus::Applied => {
                            prop_assert_eq!(tree.num_nodes(), before);
                        }
                        Ok(_) => {}
                        Err(_) => prop_assert_eq!(tree.num_nodes(), before),
                    }
                }
                Op::Resync { worker, events } => {
                    let _ = tree.resync(&EventBatch { worker: WorkerId(worker), seq: 100, events });
                }
                Op::RemoveWorker(worker) => {
                    let known = tree.workers.slot_of(WorkerId(worker)).is_some();
                    prop_assert_eq!(tree.remove_worker(WorkerId(worker)).is_ok(), known);
                }
                Op::Approximate(worker, hashes) => {
                    let hashes: Vec<SeqHash> = hashes.into_iter().map(SeqHash).collect();
                    tree.insert_approximate(WorkerId(worker), &hashes, now + 20).unwrap();
                    tree.expire_approximate(now);
                }
                Op::Query(hashes, early_exit) => {
                    let hashes: Vec<SeqHash> = hashes.into_iter().map(SeqHash).collect();
                    let scores = tree.find_matches(&hashes, early_exit);
                    for (worker, depths) in &scores.scores {
                        prop_assert!(tree.workers.slot_of(*worker).is_some());
                        prop_assert!(depths.total() as usize <= hashes.len());
                        prop_assert!(depths.total() > 0);
                    }
                }
            }
            prop_assert!(tree.num_nodes() <= 24);
            check_invariants(&tree);
        }
        let (restored, _) = PrefixTree::from_snapshot(&tree.to_snapshot(SnapshotMarks::default())).unwrap();
        check_invariants(&restored);
    }
}
