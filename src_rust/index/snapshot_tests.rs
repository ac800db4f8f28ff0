//! A snapshot that is damaged in any one byte, or cut short anywhere, is
//! refused: none of it loads with changed workers, positions or tiers.

use super::*;
use crate::hashing::{namespace_seed, BlockHasher};
use crate::ids::{EngineBlockId, Tier};
use proptest::prelude::*;

fn stored(tokens: &[u32], tier: Tier) -> KvEvent {
    let seqs = BlockHasher::new(4, namespace_seed("")).seq_hashes(tokens);
    KvEvent::Stored {
        parent: None,
        block_ids: seqs.iter().map(|s| EngineBlockId(s.0 ^ 0xabc)).collect(),
        content: BlockContent::Tokens(tokens.to_vec()),
        tier,
        namespace_seed: namespace_seed(""),
    }
}

/// A snapshot of three workers on all three tiers, with stream positions.
fn real_snapshot() -> Vec<u8> {
    let idx = PrefixIndex::new(IndexConfig {
        block_size: 4,
        max_nodes: Some(1000),
    });
    for (worker, tier, len) in [
        (1, Tier::Device, 24),
        (2, Tier::Host, 12),
        (7, Tier::Disk, 8),
    ] {
        for seq in 0..3 {
            let tokens: Vec<u32> = (seq * 100..seq * 100 + len).collect();
            let batch = EventBatch {
                worker: WorkerId(worker),
                seq: seq as u64,
                events: vec![stored(&tokens, tier)],
            };
            idx.apply(&batch, true).unwrap();
        }
    }
    idx.snapshot(SnapshotMarks {
        stream_position: 41,
        next_worker_id: 8,
    })
}

fn refused(bytes: &[u8]) -> bool {
    matches!(PrefixIndex::restore(bytes), Err(IndexError::BadSnapshot(_)))
}

#[test]
fn the_real_snapshot_loads() {
    let (restored, marks) = PrefixIndex::restore(&real_snapshot()).unwrap();
    assert_eq!(restored.workers().len(), 3);
    assert_eq!(marks.next_worker_id, 8);
}

#[test]
fn every_truncation_is_refused() {
    let bytes = real_snapshot();
    for len in 0..bytes.len() {
        assert!(
            refused(&bytes[..len]),
            "cut to {len} of {} bytes",
            bytes.len()
        );
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(refused(&longer), "a trailing byte");
}

#[test]
fn refusals_say_what_is_wrong_on_one_line() {
    let bytes = real_snapshot();
    let message = |b: &[u8]| PrefixIndex::restore(b).err().unwrap().to_string();
    assert!(message(&bytes[..10]).contains("truncated"));
    assert!(message(&bytes[..bytes.len() - 1]).contains("truncated"));
    let mut flipped = bytes.clone();
    *flipped.last_mut().unwrap() ^= 1;
    assert!(message(&flipped).contains("checksum mismatch"));
    assert!(message(b"KVRIDX02 an older format").contains("version"));
    for b in [&bytes[..10], &flipped[..]] {
        assert!(!message(b).contains('\n'));
    }
}

proptest! {
    #[test]
    fn every_single_byte_flip_is_refused(mask in 1u8..=255) {
        let bytes = real_snapshot();
        for pos in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[pos] ^= mask;
            prop_assert!(refused(&damaged), "byte {} of {} xor {:#04x}", pos, bytes.len(), mask);
        }
    }
}
