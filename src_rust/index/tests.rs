//! Unit tests of the prefix index's behaviour.

use super::*;
use crate::hashing::{namespace_seed, BlockHasher};
use crate::ids::{EngineBlockId, Tier};

const BS: usize = 4;

fn tokens(range: std::ops::Range<u32>) -> Vec<u32> {
    range.collect()
}

fn seqs(tokens: &[u32]) -> Vec<SeqHash> {
    BlockHasher::new(BS, namespace_seed("")).seq_hashes(tokens)
}

/// A stored event whose engine ids are the router's own hashes.
fn stored(tokens: &[u32], parent: Option<SeqHash>, tier: Tier) -> KvEvent {
    let full = seqs(tokens);
    KvEvent::Stored {
        parent: parent.map(|p| EngineBlockId(p.0)),
        block_ids: full.iter().map(|s| EngineBlockId(s.0)).collect(),
        content: BlockContent::Tokens(tokens.to_vec()),
        tier,
        namespace_seed: namespace_seed(""),
    }
}

fn batch(worker: u64, seq: u64, events: Vec<KvEvent>) -> EventBatch {
    EventBatch {
        worker: WorkerId(worker),
        seq,
        events,
    }
}

fn index() -> PrefixIndex {
    PrefixIndex::new(IndexConfig {
        block_size: BS,
        max_nodes: None,
    })
}

#[test]
fn longest_prefix_per_worker() {
    let idx = index();
    let all = tokens(0..16);
    idx.apply(&batch(1, 0, vec![stored(&all, None, Tier::Device)]), true)
        .unwrap();
    idx.apply(
        &batch(2, 0, vec![stored(&all[..8], None, Tier::Device)]),
        true,
    )
    .unwrap();
    let scores = idx.find_matches(&seqs(&all), false);
    assert_eq!(scores.depth(WorkerId(1)), 4);
    assert_eq!(scores.depth(WorkerId(2)), 2);
    assert_eq!(scores.depth(WorkerId(3)), 0);
}

#[test]
fn early_exit_stops_when_one_worker_is_left() {
    let idx = index();
    let all = tokens(0..16);
    idx.apply(&batch(1, 0, vec![stored(&all, None, Tier::Device)]), true)
        .unwrap();
    idx.apply(
        &batch(2, 0, vec![stored(&all[..4], None, Tier::Device)]),
        true,
    )
    .unwrap();
    let scores = idx.find_matches(&seqs(&all), true);
    assert_eq!(scores.depth(WorkerId(2)), 1);
    assert!(scores.depth(WorkerId(1)) < 4);
}

#[test]
fn depth_is_split_by_tier() {
    let idx = index();
    let all = tokens(0..12);
    let hashes = seqs(&all);
    idx.apply(
        &batch(
            1,
            0,
            vec![
                stored(&all[..8], None, Tier::Device),
                stored(&all[8..], Some(hashes[1]), Tier::Host),
            ],
        ),
        true,
    )
    .unwrap();
    let depths = idx.find_matches(&hashes, false).get(WorkerId(1)).unwrap();
    assert_eq!((depths.device, depths.host, depths.disk), (2, 1, 0));
}

#[test]
fn removal_by_tier_keeps_other_tiers() {
    let idx = index();
    let all = tokens(0..4);
    let id = EngineBlockId(seqs(&all)[0].0);
    idx.apply(
        &batch(
            1,
            0,
            vec![
                stored(&all, None, Tier::Device),
                stored(&all, None, Tier::Host),
            ],
        ),
        true,
    )
    .unwrap();
    let removed = KvEvent::Removed {
        block_ids: vec![id],
        tier: Tier::Device,
    };
    idx.apply(&batch(1, 1, vec![removed]), true).unwrap();
    let depths = idx
        .find_matches(&seqs(&all), false)
        .get(WorkerId(1))
        .unwrap();
    assert_eq!((depths.device, depths.host), (0, 1));
}

#[test]
fn foreign_engine_ids_are_mapped() {
    let idx = index();
    let all = tokens(0..8);
    let event = KvEvent::Stored {
        parent: None,
        block_ids: vec![EngineBlockId(100), EngineBlockId(101)],
        content: BlockContent::Tokens(all.clone()),
        tier: Tier::Device,
        namespace_seed: namespace_seed(""),
    };
    idx.apply(&batch(1, 0, vec![event]), true).unwrap();
    let child = KvEvent::Stored {
        parent: Some(EngineBlockId(101)),
        block_ids: vec![EngineBlockId(102)],
        content: BlockContent::Tokens(tokens(8..12)),
        tier: Tier::Device,
        namespace_seed: namespace_seed(""),
    };
    idx.apply(&batch(1, 1, vec![child]), true).unwrap();
    assert_eq!(
        idx.find_matches(&seqs(&tokens(0..12)), false)
            .depth(WorkerId(1)),
        3
    );
    let removed = KvEvent::Removed {
        block_ids: vec![EngineBlockId(101)],
        tier: Tier::Device,
    };
    idx.apply(&batch(1, 2, vec![removed]), true).unwrap();
    assert_eq!(
        idx.find_matches(&seqs(&tokens(0..12)), false)
            .depth(WorkerId(1)),
        1
    );
}

#[test]
fn sequence_numbers_detect_gaps_and_ignore_duplicates() {
    let idx = index();
    let first = batch(1, 0, vec![stored(&tokens(0..4), None, Tier::Device)]);
    assert_eq!(idx.apply(&first, true).unwrap().status, SeqStatus::Applied);
    assert_eq!(
        idx.apply(&first, true).unwrap().status,
        SeqStatus::Duplicate
    );
    let skipped = batch(1, 5, vec![KvEvent::Cleared]);
    assert_eq!(
        idx.apply(&skipped, true).unwrap().status,
        SeqStatus::Gap { expected: 1 }
    );
    assert_eq!(
        idx.find_matches(&seqs(&tokens(0..4)), false)
            .depth(WorkerId(1)),
        1
    );
    let new_worker = batch(2, 3, vec![]);
    assert_eq!(
        idx.apply(&new_worker, false).unwrap().status,
        SeqStatus::Gap { expected: 0 }
    );
}

#[test]
fn resync_replaces_the_workers_view() {
    let idx = index();
    idx.apply(
        &batch(1, 0, vec![stored(&tokens(0..8), None, Tier::Device)]),
        true,
    )
    .unwrap();
    let dump = batch(1, 9, vec![stored(&tokens(100..104), None, Tier::Device)]);
    idx.resync(&dump).unwrap();
    assert_eq!(
        idx.find_matches(&seqs(&tokens(0..8)), false)
            .depth(WorkerId(1)),
        0
    );
    assert_eq!(
        idx.find_matches(&seqs(&tokens(100..104)), false)
            .depth(WorkerId(1)),
        1
    );
    let next = batch(1, 10, vec![KvEvent::Cleared]);
    assert_eq!(idx.apply(&next, true).unwrap().status, SeqStatus::Applied);
}

#[test]
fn strict_rejects_unknown_blocks_and_changes_nothing() {
    let idx = index();
    let all = tokens(0..8);
    let hashes = seqs(&all);
    let bad = batch(
        1,
        0,
        vec![
            stored(&all, None, Tier::Device),
            KvEvent::Removed {
                block_ids: vec![EngineBlockId(7)],
                tier: Tier::Device,
            },
        ],
    );
    assert!(matches!(
        idx.apply(&bad, true),
        Err(IndexError::UnknownBlock { event: 1, .. })
    ));
    assert_eq!(idx.stats().blocks, 0);
    assert_eq!(idx.stats().workers, 0);
    let orphan = batch(
        1,
        0,
        vec![stored(&all[4..], Some(SeqHash(99)), Tier::Device)],
    );
    assert!(matches!(
        idx.apply(&orphan, true),
        Err(IndexError::UnknownParent { .. })
    ));
    let ok = batch(1, 0, vec![stored(&all, None, Tier::Device)]);
    idx.apply(&ok, true).unwrap();
    let lenient = batch(
        1,
        1,
        vec![KvEvent::Removed {
            block_ids: vec![EngineBlockId(7), EngineBlockId(hashes[1].0)],
            tier: Tier::Device,
        }],
    );
    let outcome = idx.apply(&lenient, false).unwrap();
    assert_eq!((outcome.blocks_removed, outcome.unknown_removals), (1, 1));
}

#[test]
fn malformed_events_are_rejected() {
    let idx = index();
    let short = KvEvent::Stored {
        parent: None,
        block_ids: vec![EngineBlockId(1), EngineBlockId(2)],
        content: BlockContent::Tokens(tokens(0..6)),
        tier: Tier::Device,
        namespace_seed: 0,
    };
    let err = idx.apply(&batch(1, 0, vec![short]), false).unwrap_err();
    assert!(err.to_string().contains("needs 8"), "{err}");
    assert_eq!(idx.stats().workers, 0);
}

#[test]
fn remove_worker_drops_its_blocks_only() {
    let idx = index();
    let all = tokens(0..8);
    idx.apply(&batch(1, 0, vec![stored(&all, None, Tier::Device)]), true)
        .unwrap();
    idx.apply(&batch(2, 0, vec![stored(&all, None, Tier::Device)]), true)
        .unwrap();
    assert_eq!(idx.remove_worker(WorkerId(1)).unwrap(), 2);
    assert_eq!(
        idx.remove_worker(WorkerId(1)),
        Err(IndexError::UnknownWorker(WorkerId(1)))
    );
    let scores = idx.find_matches(&seqs(&all), false);
    assert_eq!(scores.scores.len(), 1);
    assert_eq!(scores.depth(WorkerId(2)), 2);
    assert_eq!(idx.stats().blocks, 2);
}

#[test]
fn blocks_held_by_many_workers_spill_and_shrink() {
    let idx = index();
    let all = tokens(0..4);
    for worker in 0..10 {
        idx.apply(
            &batch(worker, 0, vec![stored(&all, None, Tier::Device)]),
            true,
        )
        .unwrap();
    }
    assert_eq!(idx.find_matches(&seqs(&all), false).scores.len(), 10);
    for worker in 0..9 {
        idx.remove_worker(WorkerId(worker)).unwrap();
    }
    assert_eq!(idx.find_matches(&seqs(&all), false).depth(WorkerId(9)), 1);
}

#[test]
fn approximate_entries_expire_and_yield_to_events() {
    let mut tree = PrefixTree::new(BS, None);
    let all = tokens(0..8);
    let hashes = seqs(&all);
    tree.insert_approximate(WorkerId(1), &hashes, 100).unwrap();
    tree.insert_approximate(WorkerId(2), &hashes, 100).unwrap();
    assert_eq!(tree.find_matches(&hashes, false).depth(WorkerId(1)), 2);
    tree.apply(&batch(2, 0, vec![stored(&all, None, Tier::Host)]), true)
        .unwrap();
    tree.expire_approximate(100);
    assert_eq!(tree.find_matches(&hashes, false).depth(WorkerId(1)), 0);
    let confirmed = tree.find_matches(&hashes, false).get(WorkerId(2)).unwrap();
    assert_eq!(confirmed.host, 2, "the confirmed tier replaces the guess");
    assert_eq!(tree.num_approximate(), 0);
}

#[test]
fn refreshed_approximate_entries_live_until_the_new_expiry() {
    let mut tree = PrefixTree::new(BS, None);
    let hashes = seqs(&tokens(0..4));
    tree.insert_approximate(WorkerId(1), &hashes, 100).unwrap();
    tree.insert_approximate(WorkerId(1), &hashes, 200).unwrap();
    tree.expire_approximate(150);
    assert_eq!(tree.find_matches(&hashes, false).depth(WorkerId(1)), 1);
    tree.expire_approximate(200);
    assert_eq!(tree.num_nodes(), 0);
}

#[test]
fn pruning_keeps_the_bound_and_drops_least_recently_used() {
    let idx = PrefixIndex::new(IndexConfig {
        block_size: BS,
        max_nodes: Some(100),
    });
    let hot = tokens(0..8);
    idx.apply(&batch(1, 0, vec![stored(&hot, None, Tier::Device)]), true)
        .unwrap();
    for seq in 1..60u64 {
        let start = 1000 * seq as u32;
        idx.apply(
            &batch(
                1,
                seq,
                vec![stored(&tokens(start..start + 8), None, Tier::Device)],
            ),
            false,
        )
        .unwrap();
        idx.find_matches(&seqs(&hot), false);
    }
    let stats = idx.stats();
    assert!(stats.blocks <= 100, "{stats:?}");
    assert!(stats.pruned_total > 0);
    assert_eq!(idx.find_matches(&seqs(&hot), false).depth(WorkerId(1)), 2);
    assert_eq!(idx.workers()[0].blocks, stats.blocks);
}

/// Eight-token prompts sharing no block, the p-th starting at token 1000·p.
fn distinct_prompts(range: std::ops::Range<u32>) -> Vec<Vec<u32>> {
    range.map(|p| tokens(1000 * p..1000 * p + 8)).collect()
}

/// Worker 1's events, one a prompt, numbered from `first`; the next number.
fn apply_each(
    tree: &mut PrefixTree,
    first: u64,
    prompts: &[Vec<u32>],
    event: impl Fn(&[u32]) -> KvEvent,
) -> u64 {
    for (i, prompt) in prompts.iter().enumerate() {
        tree.apply(&batch(1, first + i as u64, vec![event(prompt)]), true)
            .unwrap();
    }
    first + prompts.len() as u64
}

fn removed(prompt: &[u32]) -> KvEvent {
    KvEvent::Removed {
        block_ids: seqs(prompt).iter().map(|s| EngineBlockId(s.0)).collect(),
        tier: Tier::Device,
    }
}

fn stored_on_device(prompt: &[u32]) -> KvEvent {
    stored(prompt, None, Tier::Device)
}

#[test]
fn pruning_follows_use_across_compaction() {
    let mut tree = PrefixTree::new(BS, Some(100));
    let hot = tokens(0..8);
    let cold = distinct_prompts(1..41);
    let next = apply_each(&mut tree, 0, std::slice::from_ref(&hot), stored_on_device);
    let next = apply_each(&mut tree, next, &cold, stored_on_device);
    // Most of them go: holes outnumber the nodes, and the arena compacts.
    let slots = tree.arena.slots();
    let mut next = apply_each(&mut tree, next, &cold[..30], removed);
    assert!(tree.arena.slots() < slots, "the arena compacted");
    for prompt in &cold[30..] {
        tree.find_matches(&seqs(prompt), false);
    }
    // The hot prompt is looked up as fresh prompts fill the index past its
    // bound: what goes is the cold prompts left, used last before the
    // fresh ones were stored.
    let fresh = distinct_prompts(100..140);
    for prompt in &fresh {
        next = apply_each(
            &mut tree,
            next,
            std::slice::from_ref(prompt),
            stored_on_device,
        );
        tree.find_matches(&seqs(&hot), false);
    }
    let depth = |prompt: &[u32]| tree.find_matches(&seqs(prompt), false).depth(WorkerId(1));
    assert!(tree.pruned_total() > 0);
    assert_eq!(depth(&hot), 2);
    assert!(fresh.iter().all(|prompt| depth(prompt) == 2));
    let cold_left: u64 = cold[30..]
        .iter()
        .map(|prompt| u64::from(depth(prompt)))
        .sum();
    assert_eq!(cold_left, 20 - tree.pruned_total());
}

#[test]
fn a_block_stored_into_a_reused_slot_counts_as_just_used() {
    let mut tree = PrefixTree::new(BS, Some(100));
    let old = distinct_prompts(0..40);
    let next = apply_each(&mut tree, 0, &old, stored_on_device);
    // A fifth of the blocks go: their slots are reused, not compacted away.
    let next = apply_each(&mut tree, next, &old[..8], removed);
    let slots = tree.arena.slots();
    let fresh = distinct_prompts(100..120);
    apply_each(&mut tree, next, &fresh, stored_on_device);
    assert!(tree.arena.slots() < slots + 40, "the holes were reused");
    // Past the bound, the oldest prompts go, not those in the reused slots.
    assert!(tree.pruned_total() > 0);
    let depth = |prompt: &[u32]| tree.find_matches(&seqs(prompt), false).depth(WorkerId(1));
    assert!(fresh.iter().all(|prompt| depth(prompt) == 2));
}

#[test]
fn snapshot_round_trips_blocks_tiers_and_sequence_numbers() {
    let idx = index();
    let all = tokens(0..12);
    idx.apply(&batch(1, 0, vec![stored(&all, None, Tier::Device)]), true)
        .unwrap();
    idx.apply(
        &batch(2, 0, vec![stored(&all[..4], None, Tier::Disk)]),
        true,
    )
    .unwrap();
    idx.insert_approximate(WorkerId(3), &seqs(&all), std::time::Duration::from_secs(60))
        .unwrap();
    let marks = SnapshotMarks {
        stream_position: 7,
        next_worker_id: 9,
    };
    let (restored, kept) = PrefixIndex::restore(&idx.snapshot(marks)).unwrap();
    assert_eq!(kept, marks);
    let scores = restored.find_matches(&seqs(&all), false);
    assert_eq!(scores.depth(WorkerId(1)), 3);
    assert_eq!(scores.get(WorkerId(2)).unwrap().disk, 1);
    assert_eq!(
        scores.depth(WorkerId(3)),
        0,
        "approximate entries are not kept"
    );
    let next = batch(1, 1, vec![KvEvent::Cleared]);
    assert_eq!(
        restored.apply(&next, true).unwrap().status,
        SeqStatus::Applied
    );
    assert!(matches!(
        PrefixIndex::restore(b"nonsense"),
        Err(IndexError::BadSnapshot(_))
    ));
}

#[test]
fn churn_compacts_the_arena_and_keeps_answers() {
    let mut tree = PrefixTree::new(BS, None);
    let prompts: Vec<Vec<u32>> = (0..3000u32).map(|p| tokens(p * 8..p * 8 + 8)).collect();
    for (seq, prompt) in prompts.iter().enumerate() {
        let worker = seq as u64 % 3;
        let batch = batch(
            worker,
            seq as u64 / 3,
            vec![stored(prompt, None, Tier::Device)],
        );
        tree.apply(&batch, true).unwrap();
    }
    let slots_before = tree.arena.slots();
    for (seq, prompt) in prompts.iter().enumerate().take(2700) {
        let worker = seq as u64 % 3;
        let removed = KvEvent::Removed {
            block_ids: seqs(prompt).iter().map(|s| EngineBlockId(s.0)).collect(),
            tier: Tier::Device,
        };
        let next = 1000 + seq as u64 / 3;
        tree.apply(&batch(worker, next, vec![removed]), true)
            .unwrap();
    }
    assert!(
        tree.arena.slots() < slots_before / 2,
        "holes were squeezed out"
    );
    assert_eq!(tree.num_nodes(), 600);
    for (seq, prompt) in prompts.iter().enumerate() {
        let expected = if seq < 2700 { 0 } else { 2 };
        let worker = WorkerId(seq as u64 % 3);
        assert_eq!(
            tree.find_matches(&seqs(prompt), false).depth(worker),
            expected
        );
    }
}

#[test]
fn foreign_engine_ids_survive_compaction() {
    let mut tree = PrefixTree::new(BS, None);
    let foreign = |p: u32, b: u32| EngineBlockId((1 << 40) + u64::from(p) * 2 + u64::from(b));
    for p in 0..3000u32 {
        let event = KvEvent::Stored {
            parent: None,
            block_ids: vec![foreign(p, 0), foreign(p, 1)],
            content: BlockContent::Tokens(tokens(p * 8..p * 8 + 8)),
            tier: Tier::Device,
            namespace_seed: namespace_seed(""),
        };
        tree.apply(&batch(1, u64::from(p), vec![event]), true)
            .unwrap();
    }
    for p in 0..2700u32 {
        let removed = KvEvent::Removed {
            block_ids: vec![foreign(p, 0), foreign(p, 1)],
            tier: Tier::Device,
        };
        tree.apply(&batch(1, 3000 + u64::from(p), vec![removed]), true)
            .unwrap();
    }
    assert!(tree.arena.slots() < 6000 / 2, "holes were squeezed out");
    let child = KvEvent::Stored {
        parent: Some(foreign(2999, 1)),
        block_ids: vec![EngineBlockId(7)],
        content: BlockContent::Tokens(tokens(90_000..90_004)),
        tier: Tier::Device,
        namespace_seed: namespace_seed(""),
    };
    tree.apply(&batch(1, 5700, vec![child]), true).unwrap();
    let mut query = tokens(2999 * 8..2999 * 8 + 8);
    query.extend(90_000..90_004);
    assert_eq!(
        tree.find_matches(&seqs(&query), false).depth(WorkerId(1)),
        3
    );
    let rest: Vec<EngineBlockId> = (2700..3000u32)
        .flat_map(|p| [foreign(p, 0), foreign(p, 1)])
        .chain([EngineBlockId(7)])
        .collect();
    let removed = KvEvent::Removed {
        block_ids: rest,
        tier: Tier::Device,
    };
    let outcome = tree.apply(&batch(1, 5701, vec![removed]), true).unwrap();
    assert_eq!(outcome.blocks_removed, 601);
    assert_eq!(tree.num_nodes(), 0);
}

#[test]
fn shared_engine_ids_survive_compaction() {
    let mut tree = PrefixTree::new(BS, None);
    let foreign = |p: u32| EngineBlockId((1 << 40) + u64::from(p));
    let stored = |p: u32| KvEvent::Stored {
        parent: None,
        block_ids: vec![foreign(p)],
        content: BlockContent::Tokens(tokens(p * 4..p * 4 + 4)),
        tier: Tier::Device,
        namespace_seed: namespace_seed(""),
    };
    let removed = |p: u32| KvEvent::Removed {
        block_ids: vec![foreign(p)],
        tier: Tier::Device,
    };
    for p in 0..3000u32 {
        tree.apply(&batch(1, u64::from(p), vec![stored(p)]), true)
            .unwrap();
    }
    // Worker 2 names its last 300 blocks as worker 1 does: one name each.
    for p in 2700..3000u32 {
        tree.apply(&batch(2, u64::from(p - 2700), vec![stored(p)]), true)
            .unwrap();
    }
    for p in 0..3000u32 {
        tree.apply(&batch(1, 3000 + u64::from(p), vec![removed(p)]), true)
            .unwrap();
    }
    assert!(tree.arena.slots() < 3000, "holes were squeezed out");
    assert_eq!(tree.num_nodes(), 300);
    let rest: Vec<EngineBlockId> = (2700..3000u32).map(foreign).collect();
    let removed = KvEvent::Removed {
        block_ids: rest,
        tier: Tier::Device,
    };
    let outcome = tree.apply(&batch(2, 300, vec![removed]), true).unwrap();
    assert_eq!(outcome.blocks_removed, 300);
    assert_eq!(tree.num_nodes(), 0);
}

/// A stored event naming its blocks `first_id`, `first_id + 1`, ...
fn stored_as(tokens: &[u32], first_id: u64) -> KvEvent {
    KvEvent::Stored {
        parent: None,
        block_ids: (first_id..)
            .take(tokens.len() / BS)
            .map(EngineBlockId)
            .collect(),
        content: BlockContent::Tokens(tokens.to_vec()),
        tier: Tier::Device,
        namespace_seed: namespace_seed(""),
    }
}

fn removed_ids(first_id: u64, count: u64) -> KvEvent {
    KvEvent::Removed {
        block_ids: (first_id..first_id + count).map(EngineBlockId).collect(),
        tier: Tier::Device,
    }
}

#[test]
fn churn_reuses_holes_and_keeps_answers() {
    let mut tree = PrefixTree::new(BS, None);
    let prompt = |p: u32| tokens(p * 64..p * 64 + 64);
    let (live, rounds) = (100u32, 500u32);
    let mut widest = 0;
    let mut next_seq = [0u64; 3];
    let mut apply = |tree: &mut PrefixTree, worker: usize, event: KvEvent| {
        let outcome = tree.apply(&batch(worker as u64, next_seq[worker], vec![event]), true);
        assert_eq!(outcome.unwrap().status, SeqStatus::Applied);
        next_seq[worker] += 1;
    };
    for p in 0..rounds {
        apply(
            &mut tree,
            p as usize % 3,
            stored(&prompt(p), None, Tier::Device),
        );
        if p >= live {
            let old = p - live;
            let removed = KvEvent::Removed {
                block_ids: seqs(&prompt(old))
                    .iter()
                    .map(|s| EngineBlockId(s.0))
                    .collect(),
                tier: Tier::Device,
            };
            apply(&mut tree, old as usize % 3, removed);
        }
        widest = widest.max(tree.arena.slots());
    }
    let nodes = live as usize * 16;
    assert_eq!(tree.num_nodes(), nodes);
    // Compaction alone would let the arena reach twice the live nodes.
    assert!(
        (widest as usize) < nodes * 3 / 2,
        "arena reached {widest} slots for {nodes} nodes"
    );
    for p in 0..rounds {
        let expected = if p + live < rounds { 0 } else { 16 };
        let found = tree.find_matches(&seqs(&prompt(p)), false);
        assert_eq!(
            found.depth(WorkerId(u64::from(p % 3))),
            expected,
            "prompt {p}"
        );
    }
}

#[test]
fn engine_ids_of_pruned_blocks_do_not_name_reused_slots() {
    let mut tree = PrefixTree::new(BS, Some(100));
    let first = tokens(0..256);
    let second = tokens(1000..1256);
    let third = tokens(2000..2160);
    // Worker 2 names the first prompt's blocks differently: ids of its own.
    tree.apply(&batch(1, 0, vec![stored_as(&first, 1000)]), true)
        .unwrap();
    tree.apply(&batch(2, 0, vec![stored_as(&first, 5000)]), true)
        .unwrap();
    // Past max_nodes: the first prompt's blocks, least recently used, go.
    tree.apply(&batch(1, 1, vec![stored_as(&second, 2000)]), true)
        .unwrap();
    assert!(tree.pruned_total() > 0);
    let slots = tree.arena.slots();
    // Both workers store a third prompt, into the slots the pruned blocks left.
    tree.apply(&batch(1, 2, vec![stored_as(&third, 3000)]), true)
        .unwrap();
    tree.apply(&batch(2, 1, vec![stored_as(&third, 3000)]), true)
        .unwrap();
    assert!(
        tree.arena.slots() < slots + 40,
        "the pruned slots were reused"
    );
    // Worker 2's ids of the pruned blocks name nothing now.
    let outcome = tree
        .apply(&batch(2, 2, vec![removed_ids(5000, 64)]), false)
        .unwrap();
    assert_eq!(outcome.blocks_removed, 0);
    let found = tree.find_matches(&seqs(&third), false);
    assert_eq!(found.depth(WorkerId(2)), 40);
}

#[test]
fn an_id_another_engine_gave_a_block_does_not_name_it_for_this_one() {
    // Two engines numbering blocks with counters give id 7 to different blocks.
    let mut tree = PrefixTree::new(BS, None);
    let (a, b) = (tokens(0..4), tokens(100..104));
    tree.apply(&batch(1, 0, vec![stored_as(&a, 7)]), true)
        .unwrap();
    tree.apply(&batch(0, 0, vec![stored_as(&b, 7), stored_as(&a, 8)]), true)
        .unwrap();
    // Worker 0 removes its block 7 twice: the second time, 7 names only
    // worker 1's block, which worker 0 holds as its block 8.
    let twice = KvEvent::Removed {
        block_ids: vec![EngineBlockId(7), EngineBlockId(7)],
        tier: Tier::Device,
    };
    let outcome = tree.apply(&batch(0, 1, vec![twice]), false).unwrap();
    assert_eq!((outcome.blocks_removed, outcome.unknown_removals), (1, 1));
    let found = tree.find_matches(&seqs(&a), false);
    assert_eq!((found.depth(WorkerId(0)), found.depth(WorkerId(1))), (1, 1));
    assert_eq!(tree.find_matches(&seqs(&b), false).depth(WorkerId(0)), 0);
}

#[test]
fn names_of_blocks_cleared_without_their_ids_do_not_name_the_slots_reused() {
    let mut tree = PrefixTree::new(BS, None);
    let (kept, cleared, next) = (tokens(0..256), tokens(1000..1064), tokens(2000..2064));
    tree.apply(&batch(2, 0, vec![stored_as(&kept, 5000)]), true)
        .unwrap();
    tree.apply(&batch(1, 0, vec![stored_as(&cleared, 1000)]), true)
        .unwrap();
    // A cleared worker's blocks go without their ids: their names are left
    // pointing at the holes, a fifth of the arena, which get reused.
    tree.apply(&batch(1, 1, vec![KvEvent::Cleared]), true)
        .unwrap();
    let slots = tree.arena.slots();
    tree.apply(&batch(1, 2, vec![stored_as(&next, 3000)]), true)
        .unwrap();
    assert_eq!(tree.arena.slots(), slots, "the holes were reused");
    let outcome = tree
        .apply(&batch(1, 3, vec![removed_ids(1000, 16)]), false)
        .unwrap();
    assert_eq!((outcome.blocks_removed, outcome.unknown_removals), (0, 16));
    assert_eq!(
        tree.find_matches(&seqs(&next), false).depth(WorkerId(1)),
        16
    );
    // The old ids name the cleared blocks again once they are stored again.
    tree.apply(&batch(1, 4, vec![stored_as(&cleared, 1000)]), true)
        .unwrap();
    let outcome = tree
        .apply(&batch(1, 5, vec![removed_ids(1000, 16)]), false)
        .unwrap();
    assert_eq!(outcome.blocks_removed, 16);
    assert_eq!(
        tree.find_matches(&seqs(&cleared), false).depth(WorkerId(1)),
        0
    );
    assert_eq!(
        tree.find_matches(&seqs(&next), false).depth(WorkerId(1)),
        16
    );
}

#[test]
fn engine_ids_still_remove_their_blocks_after_a_snapshot() {
    let idx = index();
    let prompt = tokens(0..64);
    // Shared names (two workers, one id per block, high bits set) and one
    // worker's own names for the same blocks.
    let shared = 0xDEAD_BEEF_0000_0000;
    for worker in [1, 2] {
        idx.apply(&batch(worker, 0, vec![stored_as(&prompt, shared)]), true)
            .unwrap();
    }
    idx.apply(&batch(3, 0, vec![stored_as(&prompt, 77)]), true)
        .unwrap();
    let marks = SnapshotMarks {
        stream_position: 1,
        next_worker_id: 4,
    };
    let (restored, _) = PrefixIndex::restore(&idx.snapshot(marks)).unwrap();
    for (worker, first_id) in [(1, shared), (2, shared), (3, 77)] {
        let outcome = restored
            .apply(&batch(worker, 1, vec![removed_ids(first_id, 16)]), true)
            .unwrap();
        assert_eq!((outcome.blocks_removed, outcome.unknown_removals), (16, 0));
    }
    assert_eq!(restored.stats().blocks, 0);
}

fn foreign_block(id: u64) -> KvEvent {
    KvEvent::Stored {
        parent: None,
        block_ids: vec![EngineBlockId(id)],
        content: BlockContent::Tokens(tokens(0..4)),
        tier: Tier::Device,
        namespace_seed: namespace_seed(""),
    }
}

fn removed_block(id: u64) -> KvEvent {
    KvEvent::Removed {
        block_ids: vec![EngineBlockId(id)],
        tier: Tier::Device,
    }
}

/// A reservation gives both tables one home per block of capacity, the
/// name table once an engine names blocks by ids of its own, and is capped
/// by the index's bound and by `MAX_RESERVED_BLOCKS`: a worker declaring an
/// absurd capacity costs a fixed amount of memory, not an allocation
/// failure. The batch with the first engine id makes the name table small,
/// and the index's sizing thread brings it to the reserved size: made in
/// that batch, a table of up to 128 MiB stalled its apply, under the write
/// lock.
#[test]
fn a_reservation_covers_both_tables_and_is_capped() {
    let table_of = |blocks: usize| (blocks.next_power_of_two() + 64) * 8;
    let mut tree = PrefixTree::new(4, None);
    tree.reserve(10_000);
    assert_eq!(tree.table_bytes(), table_of(10_000));
    tree.apply(&batch(1, 0, vec![foreign_block(100)]), true)
        .unwrap();
    assert_eq!(tree.table_bytes(), table_of(10_000) + table_of(16));

    let index = index();
    index.reserve(10_000);
    index
        .apply(&batch(1, 0, vec![foreign_block(100)]), true)
        .unwrap();
    index.wait_sized();
    assert_eq!(index.stats().table_bytes, 2 * table_of(10_000));
    assert_eq!(
        index
            .apply(&batch(1, 1, vec![removed_block(100)]), true)
            .unwrap()
            .blocks_removed,
        1
    );

    let mut bounded = PrefixTree::new(4, Some(1_000));
    bounded.reserve(usize::MAX);
    assert_eq!(bounded.table_bytes(), table_of(1_000));

    let mut unbounded = PrefixTree::new(4, None);
    unbounded.reserve(usize::MAX);
    assert_eq!(unbounded.table_bytes(), table_of(MAX_RESERVED_BLOCKS));
}

/// A router asks for a reservation at every registration, on the thread
/// that handles it: the service's event loop. The ask returns at once, even
/// with the index locked (here by the test, as a long batch would), and the
/// sizing thread makes the tables once the lock is free.
#[test]
fn a_reservation_in_the_background_does_not_wait_for_the_index() {
    let index = index();
    let held = index.tree.write();
    index.reserve_in_background(1 << 20);
    index.reserve_in_background(1 << 18);
    drop(held);
    index.wait_sized();
    assert_eq!(index.stats().table_bytes, ((1 << 18) + 64) * 8);
}

/// Reservations asked in the background, of sizes that grow and shrink the
/// tables, while one thread applies batches (engine ids of their own, so
/// that the name table is made and brought to size too) and another looks
/// prompts up: whatever the interleaving, the index ends answering as one
/// that applied the same batches with no reservation at all.
#[test]
fn background_reservations_while_batches_apply_keep_every_answer() {
    let prompts: Vec<Vec<u32>> = (0..48)
        .map(|p| tokens(p * 1_000..p * 1_000 + 160))
        .collect();
    let named = |p: usize, prompt: &[u32]| KvEvent::Stored {
        parent: None,
        block_ids: (0..prompt.len() / BS)
            .map(|b| EngineBlockId((p * 100 + b) as u64 + 1))
            .collect(),
        content: BlockContent::Tokens(prompt.to_vec()),
        tier: Tier::Device,
        namespace_seed: namespace_seed(""),
    };
    let mut batches = Vec::new();
    for (p, prompt) in prompts.iter().enumerate() {
        let worker = (p % 4) as u64;
        let seq = (p / 4) as u64 * 2;
        batches.push(batch(worker, seq, vec![named(p, prompt)]));
        let evicted = (20..40).map(|b| EngineBlockId((p * 100 + b) as u64 + 1));
        let removal = KvEvent::Removed {
            block_ids: evicted.collect(),
            tier: Tier::Device,
        };
        batches.push(batch(worker, seq + 1, vec![removal]));
    }
    let plain = index();
    for b in &batches {
        plain.apply(b, true).unwrap();
    }
    let sized = index();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for b in &batches {
                sized.apply(b, true).unwrap();
            }
        });
        scope.spawn(|| {
            for (i, prompt) in prompts.iter().cycle().take(400).enumerate() {
                sized.reserve_in_background([16, 1 << 14, 300, 1 << 12][i % 4]);
                sized.find_matches(&seqs(prompt), false);
            }
        });
    });
    sized.wait_sized();
    for prompt in &prompts {
        let hashes = seqs(prompt);
        assert_eq!(
            sized.find_matches(&hashes, false),
            plain.find_matches(&hashes, false)
        );
    }
    assert_eq!(sized.stats().blocks, plain.stats().blocks);
    assert_eq!(sized.stats().table_bytes, 2 * ((1 << 12) + 64) * 8);
}

/// An index emptied of its named blocks, then reserved smaller: the next
/// engine id starts a small name table brought to the new reservation,
/// not one of the old reservation's size.
#[test]
fn a_name_table_made_again_takes_the_reservation_in_force() {
    let table_of = |blocks: usize| (blocks.next_power_of_two() + 64) * 8;
    let index = index();
    index.reserve(10_000);
    let prompt = tokens(0..4 * 32);
    let ids: Vec<EngineBlockId> = (1..=32).map(EngineBlockId).collect();
    let store = |ids: &[EngineBlockId]| KvEvent::Stored {
        parent: None,
        block_ids: ids.to_vec(),
        content: BlockContent::Tokens(prompt[..4 * ids.len()].to_vec()),
        tier: Tier::Device,
        namespace_seed: namespace_seed(""),
    };
    index.apply(&batch(1, 0, vec![store(&ids)]), true).unwrap();
    index.wait_sized();
    assert_eq!(index.stats().table_bytes, 2 * table_of(10_000));
    let removal = KvEvent::Removed {
        block_ids: ids.clone(),
        tier: Tier::Device,
    };
    index.apply(&batch(1, 1, vec![removal]), true).unwrap();
    index.wait_sized();
    assert_eq!(index.stats().blocks, 0);
    index.reserve(100);
    index
        .apply(&batch(1, 2, vec![store(&ids[..1])]), true)
        .unwrap();
    index.wait_sized();
    assert_eq!(index.stats().table_bytes, 2 * table_of(100));
}

/// A worker's first batch of engine ids of its own, applied a slice at a
/// time as the service applies big batches, ends with the name table at
/// the reserved size.
#[test]
fn a_sliced_first_batch_of_engine_ids_gets_the_reserved_name_table() {
    let index = index();
    index.reserve(1 << 14);
    let prompt = tokens(0..4 * 3_000);
    let event = KvEvent::Stored {
        parent: None,
        block_ids: (1..=3_000).map(EngineBlockId).collect(),
        content: BlockContent::Tokens(prompt.clone()),
        tier: Tier::Device,
        namespace_seed: namespace_seed(""),
    };
    index
        .apply_in_slices(&batch(1, 0, vec![event]), false)
        .unwrap();
    index.wait_sized();
    assert_eq!(index.stats().table_bytes, 2 * ((1 << 14) + 64) * 8);
    assert_eq!(
        index.find_matches(&seqs(&prompt), false).depth(WorkerId(1)),
        3_000
    );
}

/// A first batch of engine ids, applied in slices, makes its name table
/// with room for every slice's blocks: sized for its first slice alone, it
/// doubled once per power of two under the lock, between the slices.
#[test]
fn a_first_batch_of_engine_ids_makes_its_name_table_for_all_its_slices() {
    let mut tree = PrefixTree::new(BS, None);
    tree.reserve(1 << 14);
    let events = (0..30u32)
        .map(|e| KvEvent::Stored {
            parent: None,
            block_ids: (0..100)
                .map(|b| EngineBlockId(1 + u64::from(e * 100 + b)))
                .collect(),
            content: BlockContent::Tokens(tokens(e * 400..(e + 1) * 400)),
            tier: Tier::Device,
            namespace_seed: namespace_seed(""),
        })
        .collect();
    let batch = batch(1, 0, events);
    let Started::Apply(target) = tree.start_apply(&batch, false).unwrap() else {
        panic!("the worker's first batch is applied");
    };
    let unnamed = tree.table_bytes();
    tree.apply_slice(target, &batch.events[..1]).unwrap();
    // 3,000 blocks at most 7/8 full: 4,096 homes and the run's overflow.
    assert_eq!(tree.table_bytes() - unnamed, (4_096 + 64) * 8);
}

/// A dump let in between the slices of a batch from the worker's stream
/// before it (a worker that reconnected while its big batch was applied)
/// ends that batch: its later slices are not applied over the dump, and
/// the stream goes on after the dump's number, not the old batch's.
#[test]
fn a_resync_between_slices_ends_the_batch_it_replaces() {
    let mut tree = PrefixTree::new(BS, None);
    let (first, second, dumped) = (tokens(0..16), tokens(100..116), tokens(200..216));
    let old = batch(1, 0, vec![stored_as(&first, 10), stored_as(&second, 20)]);
    let Started::Apply(target) = tree.start_apply(&old, false).unwrap() else {
        panic!("the worker's first batch is applied");
    };
    tree.apply_slice(target, &old.events[..1]).unwrap();
    tree.resync(&batch(1, 7, vec![stored_as(&dumped, 30)]))
        .unwrap();
    assert!(tree.apply_slice(target, &old.events[1..]).is_none());
    tree.finish_apply(target, old.seq);
    assert_eq!(
        tree.find_matches(&seqs(&second), false).depth(WorkerId(1)),
        0
    );
    let next = tree
        .apply(&batch(1, 8, vec![removed_ids(30, 4)]), false)
        .unwrap();
    assert_eq!(next.status, SeqStatus::Applied);
    assert_eq!(next.blocks_removed, 4);
}

/// The count that sizes a first name table is the batch's own, also when
/// names another worker's batch made went away between its slices.
#[test]
fn a_name_table_made_after_names_went_away_is_made_for_its_own_batch() {
    let mut tree = PrefixTree::new(BS, None);
    tree.reserve(1 << 14);
    let other = batch(2, 0, vec![stored_as(&tokens(900_000..900_080), 5_000_000)]);
    tree.apply(&other, false).unwrap();
    let events = (0..30u32)
        .map(|e| stored_as(&tokens(e * 400..(e + 1) * 400), 1 + u64::from(e) * 100))
        .collect();
    let batch = batch(1, 0, events);
    let Started::Apply(target) = tree.start_apply(&batch, false).unwrap() else {
        panic!("the worker's first batch is applied");
    };
    tree.remove_worker(WorkerId(2)).unwrap();
    let unnamed = tree.table_bytes();
    tree.apply_slice(target, &batch.events[..1]).unwrap();
    assert_eq!(tree.table_bytes() - unnamed, (4_096 + 64) * 8);
}

/// A worker names blocks by ids of its own, and may send any: ids whose
/// hashes in the name table share its last home would have doubled the
/// table on every insert past the sixty-fourth, until the allocation
/// failed and the router aborted. They are kept aside instead, and found
/// and removed like any others.
#[test]
fn engine_ids_crafted_to_share_a_home_leave_the_router_standing() {
    let idx = index();
    let prompt = tokens(0..1200);
    let ids: Vec<EngineBlockId> = (0..300)
        .map(|k| arena::name_of_hash(u64::from(u32::MAX) << 32 | k))
        .collect();
    let event = KvEvent::Stored {
        parent: None,
        block_ids: ids.clone(),
        content: BlockContent::Tokens(prompt.clone()),
        tier: Tier::Device,
        namespace_seed: namespace_seed(""),
    };
    idx.apply(&batch(1, 0, vec![event]), true).unwrap();
    assert!(idx.stats().table_bytes < 1 << 20, "{:?}", idx.stats());
    assert_eq!(
        idx.find_matches(&seqs(&prompt), false).depth(WorkerId(1)),
        300
    );
    let removal = KvEvent::Removed {
        block_ids: ids[150..].to_vec(),
        tier: Tier::Device,
    };
    let outcome = idx.apply(&batch(1, 1, vec![removal]), true).unwrap();
    assert_eq!(outcome.blocks_removed, 150);
    assert_eq!(
        idx.find_matches(&seqs(&prompt), false).depth(WorkerId(1)),
        150
    );
}
