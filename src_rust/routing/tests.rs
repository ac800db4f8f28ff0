use super::*;
use crate::hashing::namespace_seed;
use crate::ids::{EngineBlockId, Tier};
use crate::index::{BlockContent, EventBatch, IndexConfig, KvEvent};
use crate::policy::{PolicyName, Role, Serves};

const BS: u64 = 16;

fn router(config: PolicyConfig, options: RouterOptions) -> Router {
    let router = Router::new(BS, config, options).unwrap();
    router.with_pool(|pool| {
        for w in 0..2 {
            pool.upsert_worker(WorkerId(w), Role::Both, 10_000, &Serves::default());
        }
    });
    router
}

fn logged() -> RouterOptions {
    RouterOptions {
        log_decisions: true,
        share_bookings: true,
        ..RouterOptions::default()
    }
}

fn empty_index() -> PrefixIndex {
    PrefixIndex::new(IndexConfig {
        block_size: BS as usize,
        max_nodes: None,
    })
}

fn tokens(n: u32) -> Vec<u32> {
    (0..n).collect()
}

/// The index with worker 1 holding the first `blocks` blocks of `tokens(..)`.
fn cached_on_1(blocks: usize) -> PrefixIndex {
    let index = empty_index();
    let all = tokens(blocks as u32 * BS as u32);
    let hashes = BlockHasher::for_namespace(BS as usize, "").seq_hashes(&all);
    let stored = KvEvent::Stored {
        parent: None,
        block_ids: hashes.iter().map(|h| EngineBlockId(h.0)).collect(),
        content: BlockContent::Tokens(all),
        tier: Tier::Device,
        namespace_seed: namespace_seed(""),
    };
    let batch = EventBatch {
        worker: WorkerId(1),
        seq: 0,
        events: vec![stored],
    };
    index.apply(&batch, false).unwrap();
    index
}

fn prompt(tokens: &[u32]) -> Prompt<'_> {
    Prompt::Tokens {
        tokens,
        namespace: "",
    }
}

#[test]
fn every_decision_is_counted_and_recorded() {
    let index = cached_on_1(8);
    let r = router(PolicyConfig::default(), logged());
    let prompt_tokens = tokens(8 * BS as u32);
    let routed = r
        .route(&index, "a", "", "", prompt(&prompt_tokens), 0)
        .unwrap();
    assert_eq!(routed.decision.decode_worker, WorkerId(1));
    assert_eq!(routed.num_blocks, 8);
    let stats = r.stats();
    assert_eq!(stats.decisions[&(WorkerId(1), BookedAs::Decode)], 1);
    assert_eq!(stats.latency.counts.iter().sum::<u64>(), 1);
    assert_eq!(stats.overlap.sum, 1.0, "all 8 blocks cached on the winner");
    let records = r.take_records();
    assert_eq!(records.len(), 1);
    assert_eq!(
        (records[0].request_id.as_str(), records[0].overlap),
        ("a", 8)
    );
    assert!(r.take_records().is_empty(), "records are drained");
}

#[test]
fn a_refusal_is_counted_by_code_and_books_nothing() {
    let index = empty_index();
    let r = Router::new(BS, PolicyConfig::default(), logged()).unwrap();
    let (id, error) = r
        .route(&index, "", "", "", prompt(&tokens(32)), 0)
        .unwrap_err();
    assert!(matches!(error, RouteError::NoWorker { .. }));
    assert!(id.starts_with("r-"), "{id}");
    assert_eq!(r.stats().errors["UNAVAILABLE"], 1);
    assert_eq!(r.booked(), 0);
    assert!(r.take_records().is_empty());
    assert!(r.take_booking_changes().is_empty());
}

#[test]
fn a_duplicate_request_id_is_refused() {
    let index = empty_index();
    let r = router(PolicyConfig::default(), RouterOptions::default());
    r.route(&index, "a", "", "", prompt(&tokens(32)), 0)
        .unwrap();
    let (_, error) = r
        .route(&index, "a", "", "", prompt(&tokens(32)), 0)
        .unwrap_err();
    assert_eq!(error, RouteError::DuplicateRequest("a".into()));
    assert_eq!(r.stats().errors["INVALID_ARGUMENT"], 1);
}

#[test]
fn made_up_request_ids_are_unique() {
    let index = empty_index();
    let options = RouterOptions {
        id_prefix: "x".into(),
        ..RouterOptions::default()
    };
    let r = router(PolicyConfig::default(), options);
    let ids: Vec<String> = (0..3)
        .map(|_| {
            r.route(&index, "", "", "", prompt(&tokens(4)), 0)
                .unwrap()
                .request_id
        })
        .collect();
    assert_eq!(ids, ["x-0", "x-1", "x-2"]);
}

#[test]
fn hashes_and_tokens_decide_alike() {
    let index = cached_on_1(4);
    let r = router(PolicyConfig::default(), RouterOptions::default());
    let all = tokens(4 * BS as u32 + 3);
    let hashes = BlockHasher::for_namespace(BS as usize, "").seq_hashes(&all);
    let by_tokens = r.route(&index, "t", "", "", prompt(&all), 0).unwrap();
    let by_hashes = r
        .route(
            &index,
            "h",
            "",
            "",
            Prompt::Hashes {
                hashes: &hashes,
                num_tokens: Some(all.len() as u64),
            },
            0,
        )
        .unwrap();
    assert_eq!(by_tokens.num_blocks, by_hashes.num_blocks);
    assert_eq!(
        by_tokens.decision.decode_candidates[1].overlap,
        by_hashes.decision.decode_candidates[1].overlap
    );
}

#[test]
fn predictions_are_made_only_behind_a_backlog() {
    let index = empty_index();
    let r = router(PolicyConfig::default(), RouterOptions::default());
    let idle = r
        .route(&index, "idle", "", "", prompt(&tokens(64)), 0)
        .unwrap();
    assert_eq!(index.num_approximate(), 0, "an idle pool predicts nothing");
    r.with_pool(|pool| {
        for w in 0..2 {
            let load = Load {
                queued_prefill_tokens: 5000,
                ..Load::default()
            };
            pool.report_load(WorkerId(w), load).unwrap();
        }
    });
    let busy = r
        .route(&index, "busy", "", "", prompt(&tokens(128)), 0)
        .unwrap();
    assert_eq!(index.num_approximate(), 8);
    let holder = busy.decision.decode_worker;
    let matches = index.find_matches(
        &BlockHasher::for_namespace(BS as usize, "").seq_hashes(&tokens(128)),
        false,
    );
    assert_eq!(matches.scores, vec![(holder, matches.scores[0].1)]);
    assert_ne!(idle.request_id, busy.request_id);
}

#[test]
fn booking_changes_follow_the_lifecycle() {
    let index = empty_index();
    let r = router(PolicyConfig::default(), logged());
    let routed = r
        .route(&index, "a", "", "", prompt(&tokens(64)), 0)
        .unwrap();
    assert!(r.prefill_done("a"));
    assert!(!r.prefill_done("a"));
    assert!(r.release("a"));
    assert!(!r.release("a"));
    let changes = r.take_booking_changes();
    assert_eq!(changes.len(), 3);
    match &changes[0] {
        BookingChange::Routed {
            request_id,
            booking,
        } => {
            assert_eq!(request_id, "a");
            assert_eq!(booking.decode_worker, routed.decision.decode_worker);
            assert_eq!(booking.decode_blocks, 4);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        changes[1..],
        [
            BookingChange::PrefillDone {
                request_id: "a".into()
            },
            BookingChange::Released {
                request_id: "a".into()
            }
        ]
    );
}

#[test]
fn a_peer_replicas_bookings_steer_the_choice() {
    let index = empty_index();
    let r = router(PolicyConfig::default(), RouterOptions::default());
    r.with_pool(|pool| {
        let booking = Booking {
            prefill_worker: WorkerId(0),
            decode_worker: WorkerId(0),
            prefill_tokens: 50_000,
            decode_blocks: 100,
            prefill_open: true,
            at_ms: 0,
        };
        pool.book_mut().charge_remote("peer", "p".into(), booking);
    });
    let routed = r
        .route(&index, "a", "", "", prompt(&tokens(64)), 0)
        .unwrap();
    assert_eq!(routed.decision.decode_worker, WorkerId(1));
    assert_eq!(r.load(WorkerId(0)).unwrap().queued_prefill_tokens, 50_000);
    r.with_pool(|pool| pool.book_mut().drop_replica("peer"));
    assert_eq!(r.load(WorkerId(0)).unwrap().queued_prefill_tokens, 0);
}

#[test]
fn baselines_are_chosen_by_name() {
    let index = cached_on_1(8);
    let config = |policy| PolicyConfig {
        policy,
        ..PolicyConfig::default()
    };
    let r = router(config(PolicyName::RoundRobin), RouterOptions::default());
    let turns: Vec<u64> = (0..4)
        .map(|i| {
            let routed = r.route(&index, &format!("r{i}"), "", "", prompt(&tokens(128)), 0);
            routed.unwrap().decision.decode_worker.0
        })
        .collect();
    assert_eq!(turns, [0, 1, 0, 1]);
    let r = router(config(PolicyName::OverlapOnly), RouterOptions::default());
    for i in 0..3 {
        let routed = r.route(&index, &format!("o{i}"), "", "", prompt(&tokens(128)), 0);
        assert_eq!(routed.unwrap().decision.decode_worker, WorkerId(1));
    }
    let r = router(config(PolicyName::Dynamo), RouterOptions::default());
    let routed = r
        .route(&index, "d", "", "", prompt(&tokens(128)), 0)
        .unwrap();
    assert_eq!(routed.decision.decode_worker, WorkerId(1));
    assert_eq!(
        routed.decision.prefill_tokens, 0,
        "all 8 blocks cached there"
    );
}

#[test]
fn a_split_baseline_lists_retries_in_turn() {
    let index = empty_index();
    let config = PolicyConfig {
        policy: PolicyName::RoundRobin,
        ..PolicyConfig::default()
    };
    let r = Router::new(BS, config, RouterOptions::default()).unwrap();
    r.with_pool(|pool| {
        for w in 0..3 {
            pool.upsert_worker(WorkerId(w), Role::Decode, 10_000, &Serves::default());
        }
        pool.upsert_worker(WorkerId(9), Role::Prefill, 10_000, &Serves::default());
    });
    r.route(&index, "a", "", "", prompt(&tokens(32)), 0)
        .unwrap();
    let routed = r
        .route(&index, "b", "", "", prompt(&tokens(32)), 0)
        .unwrap();
    let d = &routed.decision;
    assert_eq!(d.prefill_worker, Some(WorkerId(9)));
    let order: Vec<u64> = d.decode_candidates.iter().map(|c| c.worker.0).collect();
    assert_eq!(order[0], d.decode_worker.0);
    assert_eq!(order.len(), 3);
    assert_eq!(d.prefill_tokens, 32);
}

#[test]
fn a_bad_setting_is_refused_by_name() {
    let config = PolicyConfig {
        calibration_alpha: 0.0,
        ..PolicyConfig::default()
    };
    let error = Router::new(BS, config, RouterOptions::default())
        .err()
        .unwrap();
    assert!(error.contains("calibration_alpha"), "{error}");
}

#[test]
fn a_forgotten_finish_is_retired_at_the_workers_next_report() {
    let index = empty_index();
    let r = router(PolicyConfig::default(), logged());
    let grace = PolicyConfig::default().unreported_grace_ms;
    let first = r
        .route(&index, "forgotten", "", "", prompt(&tokens(64)), 0)
        .unwrap();
    let worker = first.decision.decode_worker;
    r.take_booking_changes();
    let idle = Load::default();
    assert_eq!(
        r.report_load(worker, idle, grace - 1).unwrap(),
        0,
        "within the grace"
    );
    assert_eq!(r.report_load(worker, idle, grace + 1).unwrap(), 1);
    assert_eq!(r.booked(), 0);
    assert_eq!(r.stats().retired_unreported, 1);
    assert_eq!(
        r.take_booking_changes(),
        [BookingChange::Released {
            request_id: "forgotten".into()
        }]
    );
    let busy = Load {
        active_requests: 1,
        ..Load::default()
    };
    r.route(&index, "counted", "", "", prompt(&tokens(64)), 0)
        .unwrap();
    let holder = r.with_pool(|pool| pool.book().own().next().unwrap().1.decode_worker);
    assert_eq!(
        r.report_load(holder, busy, 10 * grace).unwrap(),
        0,
        "the worker holds it"
    );
}

#[test]
fn backlog_is_the_least_loaded_healthy_workers_queued_prefill() {
    let r = router(PolicyConfig::default(), RouterOptions::default());
    let c = r.coefficients();
    assert_eq!(r.backlog_ms("").unwrap(), Some(0.0));
    let queued = |tokens| Load {
        queued_prefill_tokens: tokens,
        ..Load::default()
    };
    r.report_load(WorkerId(0), queued(1_000), 0).unwrap();
    assert_eq!(r.backlog_ms("").unwrap(), Some(0.0), "worker 1 is idle");
    r.report_load(WorkerId(1), queued(3_000), 0).unwrap();
    assert_eq!(r.backlog_ms("").unwrap(), Some(c.queue_ms(1_000.0)));
    r.with_pool(|pool| pool.set_healthy(WorkerId(0), false))
        .unwrap();
    assert_eq!(r.backlog_ms("").unwrap(), Some(c.queue_ms(3_000.0)));
    r.with_pool(|pool| pool.set_healthy(WorkerId(1), false))
        .unwrap();
    assert_eq!(r.backlog_ms("").unwrap(), None);
    assert!(matches!(
        r.backlog_ms("other"),
        Err(RouteError::UnknownModel(_))
    ));
}

/// Requests that share a hot prompt held on worker 1 count its blocks once
/// there, as Dynamo's KV router counts them, so they keep going to its
/// cache; charging each request's full prompt sent the second one away.
#[test]
fn the_dynamo_baseline_counts_a_shared_prompt_once() {
    let index = cached_on_1(64);
    let config = PolicyConfig {
        policy: PolicyName::Dynamo,
        ..PolicyConfig::default()
    };
    let r = router(config, RouterOptions::default());
    let turn = |i: u32| -> Vec<u32> {
        let mut t = tokens(64 * BS as u32);
        t.extend(10_000 + 32 * i..10_000 + 32 * (i + 1));
        t
    };
    for i in 0..6 {
        let routed = r
            .route(&index, &format!("t{i}"), "", "", prompt(&turn(i)), 0)
            .unwrap();
        assert_eq!(routed.decision.decode_worker, WorkerId(1), "request {i}");
        assert!(r.prefill_done(&format!("t{i}")));
    }
    let distinct = || r.with_pool(|pool| pool.distinct_active_blocks(WorkerId(1)));
    assert_eq!(distinct(), 64 + 6 * 2);
    for i in 0..5 {
        assert!(r.release(&format!("t{i}")));
    }
    assert_eq!(distinct(), 66);
    assert!(r.release("t5"));
    assert_eq!(distinct(), 0);
}
