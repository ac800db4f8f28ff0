//! A batch applied a slice at a time ends where it ends applied at once, and
//! a worker removed between slices gets no more of it.

use super::*;
use crate::ids::{EngineBlockId, LocalHash, Tier};
use proptest::prelude::*;

fn event() -> impl Strategy<Value = KvEvent> {
    prop_oneof![
        4 => (
            proptest::option::of((0u64..40).prop_map(EngineBlockId)),
            proptest::collection::vec((0u64..40).prop_map(EngineBlockId), 1..6),
            0u8..3,
        )
            .prop_map(|(parent, block_ids, tier)| KvEvent::Stored {
                parent,
                content: BlockContent::LocalHashes(
                    block_ids.iter().map(|b| LocalHash(b.0 % 7)).collect(),
                ),
                block_ids,
                tier: Tier::from_index(tier).unwrap(),
                namespace_seed: 0,
            }),
        2 => proptest::collection::vec((0u64..40).prop_map(EngineBlockId), 1..6)
            .prop_map(|block_ids| KvEvent::Removed { block_ids, tier: Tier::Device }),
        1 => Just(KvEvent::Cleared),
    ]
}

fn state(index: &PrefixIndex, queries: &[Vec<SeqHash>]) -> (Vec<WorkerInfo>, Vec<OverlapScores>) {
    let mut workers = index.workers();
    workers.sort_by_key(|w| w.worker);
    let matches = queries
        .iter()
        .map(|q| index.find_matches(q, false))
        .collect();
    (workers, matches)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn slices_end_where_one_apply_ends(
        batches in proptest::collection::vec(
            (0u64..3, any::<bool>(), proptest::collection::vec(event(), 0..12)), 1..8),
        work in 1usize..8,
    ) {
        let config = IndexConfig { block_size: 4, max_nodes: None };
        let (whole, sliced) = (PrefixIndex::new(config), PrefixIndex::new(config));
        let mut queries = Vec::new();
        for (worker, resync, events) in batches {
            let worker = WorkerId(worker);
            let seq = whole.workers().iter().find(|w| w.worker == worker)
                .and_then(|w| w.last_seq).map_or(0, |s| s + 1);
            let batch = EventBatch { worker, seq, events };
            let expected = if resync { whole.resync(&batch) } else { whole.apply(&batch, false) };
            prop_assert_eq!(sliced.apply_sliced(&batch, resync, work), expected);
            queries.push(chained(&batch.events));
        }
        prop_assert_eq!(state(&sliced, &queries), state(&whole, &queries));
    }
}

/// The sequence hashes of each stored event's blocks, as a prompt would
/// chain them from its start.
fn chained(events: &[KvEvent]) -> Vec<SeqHash> {
    let mut prev = None;
    events
        .iter()
        .filter_map(|event| match event {
            KvEvent::Stored {
                content: BlockContent::LocalHashes(locals),
                ..
            } => Some(locals),
            _ => None,
        })
        .flatten()
        .map(|&local| {
            let seq = crate::hashing::chain(prev, local);
            prev = Some(seq);
            seq
        })
        .collect()
}

fn stored(block: u64) -> KvEvent {
    KvEvent::Stored {
        parent: None,
        block_ids: vec![EngineBlockId(block)],
        content: BlockContent::LocalHashes(vec![LocalHash(block)]),
        tier: Tier::Device,
        namespace_seed: 0,
    }
}

#[test]
fn a_worker_removed_between_slices_gets_no_more_of_the_batch() {
    let mut tree = PrefixTree::new(4, None);
    let batch = EventBatch {
        worker: WorkerId(1),
        seq: 0,
        events: vec![stored(1), stored(2)],
    };
    let Ok(tree::Started::Apply(target)) = tree.start_apply(&batch, false) else {
        panic!("batch 0 of a new worker starts");
    };
    assert!(tree.apply_slice(target, &batch.events[..1]).is_some());
    tree.remove_worker(WorkerId(1)).unwrap();
    // Back under the same id, in the same slot: a new incarnation.
    tree.apply(
        &EventBatch {
            worker: WorkerId(1),
            seq: 0,
            events: vec![stored(3)],
        },
        false,
    )
    .unwrap();
    assert!(tree.apply_slice(target, &batch.events[1..]).is_none());
    tree.finish_apply(target, batch.seq);
    let slot = tree.workers.slot_of(WorkerId(1)).unwrap();
    assert_eq!(tree.workers.state(slot).blocks, 1);
    assert_eq!(tree.workers.state(slot).last_seq, Some(0));
}

#[test]
fn slices_cut_by_blocks_and_keep_big_events_whole() {
    let events = vec![
        stored(1),
        stored(2),
        stored(3),
        KvEvent::Removed {
            block_ids: (0..10).map(EngineBlockId).collect(),
            tier: Tier::Device,
        },
    ];
    let lengths: Vec<usize> = slices(&events, 4).map(<[KvEvent]>::len).collect();
    assert_eq!(lengths, vec![2, 1, 1]);
}
