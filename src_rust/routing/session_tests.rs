//! Session affinity through `Router::route`: a session's requests stay on
//! its last worker while the candidates tie, and never at the price of a
//! better-cached, less loaded, healthy or right-model worker.

use super::*;
use crate::hashing::namespace_seed;
use crate::ids::{EngineBlockId, Tier};
use crate::index::{BlockContent, EventBatch, IndexConfig, KvEvent};
use crate::policy::{Role, Serves, MAX_SESSIONS};
use std::collections::BTreeSet;

const BS: u64 = 16;
const AFFINITY: &str = "session affinity";

fn router(workers: &[(u64, Role, &str)], config: PolicyConfig) -> Router {
    let router = Router::new(BS, config, RouterOptions::default()).unwrap();
    router.with_pool(|pool| {
        for &(id, role, model) in workers {
            let serves = Serves {
                model: model.into(),
                adapters: Vec::new(),
            };
            pool.upsert_worker(WorkerId(id), role, 10_000, &serves);
        }
    });
    router
}

fn four() -> Router {
    let both: Vec<_> = (0..4).map(|w| (w, Role::Both, "")).collect();
    router(&both, PolicyConfig::default())
}

fn index() -> PrefixIndex {
    PrefixIndex::new(IndexConfig {
        block_size: BS as usize,
        max_nodes: None,
    })
}

/// A prompt of `blocks` full blocks that no other `turn` shares.
fn turn(n: u32, blocks: u32) -> Vec<u32> {
    (0..blocks * BS as u32).map(|i| n * 1_000_000 + i).collect()
}

fn store(index: &PrefixIndex, worker: u64, tokens: &[u32]) {
    let hashes = BlockHasher::for_namespace(BS as usize, "").seq_hashes(tokens);
    let stored = KvEvent::Stored {
        parent: None,
        block_ids: hashes.iter().map(|h| EngineBlockId(h.0)).collect(),
        content: BlockContent::Tokens(tokens.to_vec()),
        tier: Tier::Device,
        namespace_seed: namespace_seed(""),
    };
    let batch = EventBatch {
        worker: WorkerId(worker),
        seq: 0,
        events: vec![stored],
    };
    index.apply(&batch, false).unwrap();
}

/// Routes one request and leaves it booked.
fn book(
    r: &Router,
    index: &PrefixIndex,
    id: &str,
    model: &str,
    session: &str,
    t: &[u32],
) -> Decision {
    let prompt = Prompt::Tokens {
        tokens: t,
        namespace: "",
    };
    r.route(index, id, model, session, prompt, 0)
        .unwrap()
        .decision
}

/// Routes one request and releases it, as a finished turn.
fn turn_done(r: &Router, index: &PrefixIndex, id: &str, session: &str, t: &[u32]) -> Decision {
    let d = book(r, index, id, "", session, t);
    assert!(r.release(id));
    d
}

#[test]
fn first_turns_of_a_session_stay_on_one_worker_and_others_spread() {
    let (r, index) = (four(), index());
    let plain: BTreeSet<u64> = (0..8)
        .map(|n| {
            turn_done(&r, &index, &format!("p{n}"), "", &turn(n, 4))
                .decode_worker
                .0
        })
        .collect();
    assert!(plain.len() > 1, "without a session ties rotate: {plain:?}");

    let first = turn_done(&r, &index, "s0", "chat", &turn(100, 4));
    assert!(!first.reason.contains(AFFINITY), "{}", first.reason);
    for n in 1..8 {
        let d = turn_done(&r, &index, &format!("s{n}"), "chat", &turn(100 + n, 4));
        assert_eq!(d.decode_worker, first.decode_worker);
        assert!(d.reason.contains(AFFINITY), "{}", d.reason);
        assert!(d.by_affinity);
    }
    assert_eq!(r.stats().by_affinity, 7);
}

#[test]
fn a_better_cached_worker_wins_and_becomes_the_sessions_worker() {
    let (r, index) = (four(), index());
    let first = turn_done(&r, &index, "a", "chat", &turn(1, 4)).decode_worker;
    let other = (first.0 + 1) % 4;
    let cached = turn(2, 32);
    store(&index, other, &cached);
    let d = turn_done(&r, &index, "b", "chat", &cached);
    assert_eq!(d.decode_worker, WorkerId(other));
    assert!(!d.by_affinity, "{}", d.reason);
    let next = turn_done(&r, &index, "c", "chat", &turn(3, 4));
    assert_eq!(next.decode_worker, WorkerId(other), "{}", next.reason);
}

#[test]
fn a_loaded_unhealthy_or_removed_worker_is_never_pinned() {
    let (r, index) = (four(), index());
    let home = turn_done(&r, &index, "a", "chat", &turn(1, 4)).decode_worker;

    let backlog = |queued_prefill_tokens| Load {
        queued_prefill_tokens,
        ..Load::default()
    };
    r.with_pool(|pool| pool.report_load(home, backlog(5_000)))
        .unwrap();
    let d = turn_done(&r, &index, "b", "chat", &turn(3, 4));
    assert_ne!(d.decode_worker, home, "its queue makes it dearer");
    r.with_pool(|pool| pool.report_load(home, backlog(0)))
        .unwrap();

    let home = turn_done(&r, &index, "c", "chat", &turn(4, 4)).decode_worker;
    r.with_pool(|pool| pool.set_healthy(home, false)).unwrap();
    assert_ne!(
        turn_done(&r, &index, "d", "chat", &turn(5, 4)).decode_worker,
        home
    );
    r.with_pool(|pool| pool.set_healthy(home, true)).unwrap();

    let home = turn_done(&r, &index, "e", "chat", &turn(6, 4)).decode_worker;
    let key = SessionKey::of("chat");
    assert!(r.with_pool(|pool| pool.affinity(key)).is_some());
    r.with_pool(|pool| pool.remove_worker(home)).unwrap();
    assert_eq!(r.with_pool(|pool| pool.affinity(key)), None);
    r.with_pool(|pool| pool.upsert_worker(home, Role::Both, 10_000, &Serves::default()));
    assert!(!turn_done(&r, &index, "f", "chat", &turn(7, 4)).by_affinity);
}

#[test]
fn a_session_never_crosses_model_pools() {
    let workers = [
        (0, Role::Both, "a"),
        (1, Role::Both, "a"),
        (2, Role::Both, "b"),
        (3, Role::Both, "b"),
    ];
    let (r, index) = (router(&workers, PolicyConfig::default()), index());
    let on_a = book(&r, &index, "x", "a", "chat", &turn(1, 4));
    assert!(on_a.decode_worker.0 < 2);
    assert!(r.release("x"));
    let on_b = book(&r, &index, "y", "b", "chat", &turn(2, 4));
    assert!(on_b.decode_worker.0 >= 2 && !on_b.by_affinity);
}

#[test]
fn a_split_session_keeps_both_its_workers() {
    let workers = [
        (0, Role::Prefill, ""),
        (1, Role::Prefill, ""),
        (2, Role::Decode, ""),
        (3, Role::Decode, ""),
    ];
    let config = PolicyConfig {
        local_prefill_max_tokens: 0,
        ..PolicyConfig::default()
    };
    let (r, index) = (router(&workers, config), index());
    let first = turn_done(&r, &index, "a", "chat", &turn(1, 8));
    assert!(first.prefill_worker.is_some());
    for n in 2..6 {
        let d = turn_done(&r, &index, &format!("t{n}"), "chat", &turn(n, 8));
        assert_eq!(
            (d.prefill_worker, d.decode_worker),
            (first.prefill_worker, first.decode_worker),
            "{}",
            d.reason
        );
        assert!(d.by_affinity);
    }
}

#[test]
fn garbage_session_ids_stay_bounded() {
    let (r, index) = (four(), index());
    let prompt = turn(1, 1);
    for n in 0..MAX_SESSIONS + 1000 {
        turn_done(&r, &index, "g", &format!("garbage-{n}"), &prompt);
    }
    let held = r.with_pool(|pool| pool.sessions());
    assert!((MAX_SESSIONS / 2..=MAX_SESSIONS).contains(&held), "{held}");
}
