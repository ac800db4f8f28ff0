use super::*;

fn policy(workers: &[(u64, Role)]) -> Policy {
    policy_with(PolicyConfig::default(), workers)
}

fn policy_with(config: PolicyConfig, workers: &[(u64, Role)]) -> Policy {
    let mut p = Policy::new(config);
    for &(id, role) in workers {
        p.pool
            .upsert_worker(WorkerId(id), role, 16_384, &Serves::default());
    }
    p
}

fn request(blocks: u64) -> Request<'static> {
    Request {
        model: ModelId::UNNAMED,
        num_tokens: blocks * 64,
        num_blocks: blocks,
        block_size: 64,
        blocks: &[],
        session: None,
    }
}

fn cached(worker: u64, blocks: u32) -> (WorkerId, TierDepths) {
    (
        WorkerId(worker),
        TierDepths {
            device: blocks,
            host: 0,
            disk: 0,
        },
    )
}

#[test]
fn spreads_a_burst_when_no_load_is_reported() {
    let mut p = policy(&[
        (0, Role::Both),
        (1, Role::Both),
        (2, Role::Both),
        (3, Role::Both),
    ]);
    let mut counts = [0; 4];
    for i in 0..40 {
        let d = p.route(&format!("r{i}"), request(20), &[], 0).unwrap();
        counts[d.decode_worker.0 as usize] += 1;
    }
    assert_eq!(counts, [10, 10, 10, 10]);
}

#[test]
fn follows_the_cache_and_replicates_a_hot_prefix() {
    let mut p = policy(&[(0, Role::Both), (1, Role::Both)]);
    let first = p.route("a", request(200), &[cached(0, 190)], 0).unwrap();
    assert_eq!(first.decode_worker, WorkerId(0));
    // Keep sending the same hot prompt: worker 0's queue grows until paying
    // the full prefill elsewhere is faster.
    let workers: Vec<u64> = (0..30)
        .map(|i| {
            p.route(&format!("h{i}"), request(200), &[cached(0, 190)], 0)
                .unwrap()
                .decode_worker
                .0
        })
        .collect();
    assert!(workers.contains(&1), "{workers:?}");
}

#[test]
fn finished_requests_stop_counting() {
    let mut p = policy(&[(0, Role::Both)]);
    p.route("a", request(10), &[], 0).unwrap();
    assert_eq!(p.pool.load(WorkerId(0)).active_requests, 1);
    assert!(p.pool.prefill_done("a"));
    assert_eq!(p.pool.load(WorkerId(0)).queued_prefill_tokens, 0);
    assert!(p.pool.release("a"));
    assert_eq!(
        p.pool.load(WorkerId(0)),
        Load {
            capacity_blocks: 16_384,
            ..Load::default()
        }
    );
}

#[test]
fn work_finished_since_a_report_comes_off_it() {
    let mut p = policy(&[(0, Role::Both)]);
    p.route("a", request(10), &[], 0).unwrap();
    let report = Load {
        queued_prefill_tokens: 640 + 1_000,
        active_decode_blocks: 10 + 50,
        active_requests: 1 + 3,
        ..Load::default()
    };
    p.pool.report_load(WorkerId(0), report).unwrap();
    assert!(p.pool.prefill_done("a"));
    assert_eq!(p.pool.load(WorkerId(0)).queued_prefill_tokens, 1_000);
    assert!(p.pool.release("a"));
    let load = p.pool.load(WorkerId(0));
    assert_eq!((load.active_decode_blocks, load.active_requests), (50, 3));
}

#[test]
fn stale_bookings_expire() {
    let mut p = policy(&[(0, Role::Both)]);
    p.route("lost", request(10), &[], 0).unwrap();
    p.route("fresh", request(10), &[], p.config.stale_after_ms + 1)
        .unwrap();
    assert_eq!(p.pool.load(WorkerId(0)).active_requests, 1);
}

#[test]
fn errors_are_specific() {
    let mut p = policy(&[(0, Role::Prefill)]);
    assert!(matches!(
        p.route("a", request(1), &[], 0),
        Err(RouteError::NoWorker { .. })
    ));
    p.pool
        .upsert_worker(WorkerId(1), Role::Decode, 4, &Serves::default());
    assert!(matches!(
        p.route("a", request(5), &[], 0),
        Err(RouteError::NoWorker { .. })
    ));
    p.route("a", request(2), &[], 0).unwrap();
    assert!(matches!(
        p.route("a", request(2), &[], 0),
        Err(RouteError::DuplicateRequest(_))
    ));
    p.pool.set_healthy(WorkerId(1), false).unwrap();
    assert!(matches!(
        p.route("b", request(2), &[], 0),
        Err(RouteError::NoWorker { .. })
    ));
    assert_eq!(
        p.pool.set_healthy(WorkerId(9), true),
        Err(RouteError::UnknownWorker(9))
    );
}

#[test]
fn disaggregates_long_prefills_only() {
    let mut p = policy(&[(0, Role::Prefill), (1, Role::Prefill), (2, Role::Decode)]);
    let long = p.route("long", request(400), &[], 0).unwrap();
    assert!(long.prefill_worker.is_some());
    assert_eq!(long.decode_worker, WorkerId(2));
    let mostly_cached = p
        .route("short", request(400), &[cached(2, 396)], 0)
        .unwrap();
    assert_eq!(mostly_cached.prefill_worker, None);
}

#[test]
fn saturated_prefill_pool_falls_back_to_local() {
    let mut p = policy(&[(0, Role::Prefill), (1, Role::Decode)]);
    let queued = Load {
        queued_prefill_tokens: 1_000_000,
        ..Load::default()
    };
    p.pool.report_load(WorkerId(0), queued).unwrap();
    let d = p.route("a", request(400), &[], 0).unwrap();
    assert_eq!(d.prefill_worker, None);
    assert!(d.reason.contains("saturated"), "{}", d.reason);
}

#[test]
fn reported_load_counts_when_larger_than_booked() {
    let mut p = policy(&[(0, Role::Both), (1, Role::Both)]);
    p.pool
        .report_load(
            WorkerId(0),
            Load {
                queued_prefill_tokens: 50_000,
                ..Load::default()
            },
        )
        .unwrap();
    assert_eq!(
        p.route("a", request(10), &[cached(0, 10)], 0)
            .unwrap()
            .decode_worker,
        WorkerId(1)
    );
}

#[test]
fn a_backlogged_pool_keeps_requests_with_their_cache() {
    let backlogged = |congestion_weight: f64| {
        let mut p = Policy::new(PolicyConfig {
            congestion_weight,
            ..PolicyConfig::default()
        });
        for (id, queued) in [(0, 80_000), (1, 50_000)] {
            p.pool
                .upsert_worker(WorkerId(id), Role::Both, 16_384, &Serves::default());
            let load = Load {
                queued_prefill_tokens: queued,
                ..Load::default()
            };
            p.pool.report_load(WorkerId(id), load).unwrap();
        }
        p.route("warm-up", request(20), &[], 0).unwrap();
        p.route("a", request(200), &[cached(0, 150)], 0).unwrap()
    };
    // Alone, the request reaches its first token sooner on worker 1, but
    // the 9,600 tokens it would recompute there hold up everything queued
    // behind it.
    assert_eq!(backlogged(0.0).decode_worker, WorkerId(1));
    let d = backlogged(1.0);
    assert_eq!(d.decode_worker, WorkerId(0));
    let congestion: Vec<f64> = d
        .decode_candidates
        .iter()
        .map(|c| c.cost.congestion_ms)
        .collect();
    assert!(
        congestion[0] == 0.0 && congestion[1] > 1_000.0,
        "{congestion:?}"
    );
}

#[test]
fn an_idle_worker_carries_no_congestion() {
    let mut p = policy(&[(0, Role::Both), (1, Role::Both)]);
    p.route("warm-up", request(20), &[], 0).unwrap();
    p.pool.release("warm-up");
    let d = p.route("a", request(200), &[cached(0, 150)], 0).unwrap();
    assert!(d
        .decode_candidates
        .iter()
        .all(|c| c.cost.congestion_ms == 0.0));
}

#[test]
fn one_request_at_a_time_takes_tied_workers_in_turn() {
    // Each request has finished before the next arrives, so every decision
    // sees the same tie; it must not always go the same way.
    let mut p = policy(&[
        (0, Role::Both),
        (1, Role::Both),
        (2, Role::Both),
        (3, Role::Both),
    ]);
    let mut counts = [0; 4];
    for i in 0..40 {
        let id = format!("r{i}");
        let d = p.route(&id, request(2), &[], 0).unwrap();
        assert!(d.prefill_worker.is_none());
        counts[d.decode_worker.0 as usize] += 1;
        assert!(p.pool.release(&id));
    }
    assert_eq!(counts, [10, 10, 10, 10]);
}

/// Requests have been staying 2 s and a decode step takes 10 ms; then
/// worker 0 runs 30 streams over 6,000 blocks and the others are idle.
fn measured_with_worker_0_busy(workers: &[(u64, Role)], busy_blocks: u64) -> Policy {
    measured_after(workers, busy_blocks, request(20), &[])
}

/// [`measured_with_worker_0_busy`], the 100 requests that measured the
/// stays being `earlier`, cached as `cache` says.
fn measured_after(
    workers: &[(u64, Role)],
    busy_blocks: u64,
    earlier: Request<'static>,
    cache: &[(WorkerId, TierDepths)],
) -> Policy {
    let mut p = policy(workers);
    for i in 0..100 {
        p.observe(Timing::DecodeStep {
            active_blocks: 6_000.0,
            ms: 10.0,
        });
        p.route(&format!("done{i}"), earlier, cache, 0).unwrap();
    }
    let quiet = workers.last().unwrap().0;
    p.report_load(WorkerId(quiet), Load::default(), 2_000)
        .unwrap();
    for i in 0..100 {
        assert!(p.pool.release(&format!("done{i}")));
    }
    let busy = Load {
        active_decode_blocks: busy_blocks,
        active_requests: 30,
        ..Load::default()
    };
    p.report_load(WorkerId(0), busy, 2_000).unwrap();
    p
}

/// Two workers: 0 holds 190 of the request's 200 blocks and is busy, 1 is
/// idle and holds nothing.
fn hot_prompt_on_a_busy_worker() -> (Policy, Decision) {
    let mut p = measured_with_worker_0_busy(&[(0, Role::Both), (1, Role::Both)], 6_000);
    let d = p
        .route("hot", request(200), &[cached(0, 190)], 2_000)
        .unwrap();
    (p, d)
}

#[test]
fn a_hot_prompt_does_not_pile_onto_a_busy_worker() {
    // Alone, the request reaches its first token far sooner on worker 0,
    // but 30 streams there would wait for its prefill and read its KV at
    // every step they share; on the idle worker nobody waits.
    let (_, d) = hot_prompt_on_a_busy_worker();
    assert_eq!(d.decode_worker, WorkerId(1));
    let [busy, idle] = [&d.decode_candidates[0], &d.decode_candidates[1]];
    assert!(busy.cost.ttft_ms() < idle.cost.ttft_ms());
    assert!(busy.cost.stall_ms > 0.0 && busy.cost.slowdown_ms > 0.0);
    assert_eq!((idle.cost.stall_ms, idle.cost.slowdown_ms), (0.0, 0.0));
    // The predicted TTFT is the request's own, not the whole cost; the
    // explanation gives each term.
    assert!((d.predicted_ttft_ms - idle.cost.ttft_ms()).abs() < 1e-9);
    for term in ["TTFT", "queued behind", "streams stalled", "slowdown"] {
        assert!(d.reason.contains(term), "{}", d.reason);
    }
}

#[test]
fn requests_that_follow_their_cache_to_busier_workers_lengthen_the_decode_horizon() {
    // The same busy worker and the same request, after two histories. In
    // one the requests before spread over the idle workers: the next
    // arrival evens out whatever imbalance a placement makes. In the other
    // they all followed their cache to worker 2, however many were in
    // flight there: an imbalance stays, and what the request's KV costs
    // the streams on worker 0 is priced over more of their steps.
    let workers = [(0, Role::Both), (1, Role::Both), (2, Role::Both)];
    let spread = measured_after(&workers, 6_000, request(20), &[]);
    let followed = measured_after(&workers, 6_000, request(2_000), &[cached(2, 2_000)]);
    let slowdown_on_0 = |mut p: Policy| {
        let d = p
            .route("hot", request(200), &[cached(0, 190)], 2_000)
            .unwrap();
        d.decode_candidates[0].cost.slowdown_ms
    };
    let (short, long) = (slowdown_on_0(spread), slowdown_on_0(followed));
    assert!(short > 0.0);
    assert!(long > 3.0 * short, "{long} against {short}");
}

/// Routes and finishes 300 one-block requests, one a millisecond from 0,
/// on idle workers: the typical first token is then ~13 ms.
fn serve_short_requests(p: &mut Policy) {
    for i in 0..300 {
        let id = format!("short{i}");
        p.route(&id, request(1), &[], i).unwrap();
        assert!(p.pool.release(&id));
    }
}

#[test]
fn a_request_is_not_left_far_behind_a_queue_to_spare_the_streams() {
    // Short requests have been getting their first token in ~13 ms. Now
    // worker 1 holds the prompt behind 60,000 queued tokens (1.3 s), and
    // worker 0 holds none of it and runs 30 streams, which would each wait
    // for its prefill (0.27 s). Summed, their wait outweighs the request's
    // own; but its own is a hundred typical first tokens, the slowest first
    // tokens are made of such waits, and the tail term prices them.
    let route = |tail_weight: f64| {
        let config = PolicyConfig {
            tail_weight,
            ..PolicyConfig::default()
        };
        let mut p = policy_with(config, &[(0, Role::Both), (1, Role::Both)]);
        serve_short_requests(&mut p);
        let streams = Load {
            active_decode_blocks: 6_000,
            active_requests: 30,
            ..Load::default()
        };
        let queued = Load {
            queued_prefill_tokens: 60_000,
            ..Load::default()
        };
        p.report_load(WorkerId(0), streams, 300).unwrap();
        p.report_load(WorkerId(1), queued, 300).unwrap();
        p.route("late", request(200), &[cached(1, 190)], 300)
            .unwrap()
    };
    let summed = route(0.0);
    assert_eq!(summed.decode_worker, WorkerId(1));
    assert!(summed
        .decode_candidates
        .iter()
        .all(|c| c.cost.tail_ms == 0.0));
    let d = route(1.0);
    assert_eq!(d.decode_worker, WorkerId(0));
    let [streams, queue] = [&d.decode_candidates[0], &d.decode_candidates[1]];
    assert!(queue.cost.ttft_ms() > 50.0 * 13.0);
    assert!(queue.cost.tail_ms > 50.0 * queue.cost.queue_ms);
    assert_eq!(streams.cost.tail_ms, 0.0);
    assert!(streams.cost.stall_ms > queue.cost.ttft_ms());
    assert!(queue.cost.total() > queue.cost.ttft_ms() + queue.cost.tail_ms - 1e-9);
}

#[test]
fn a_split_prices_the_prefill_wait_against_the_pairs_first_token() {
    // The first token of a split comes after the transfer to the decode
    // worker, so the tail term of each pair counts the prefill worker's
    // queue against the pair's TTFT, not the prefill alone's.
    let mut p = policy(&[(0, Role::Prefill), (1, Role::Decode)]);
    serve_short_requests(&mut p);
    let queued = Load {
        queued_prefill_tokens: 20_000,
        ..Load::default()
    };
    p.report_load(WorkerId(0), queued, 300).unwrap();
    let d = p.route("long", request(400), &[], 300).unwrap();
    assert_eq!(d.prefill_worker, Some(WorkerId(0)));
    let [prefill, pair] = [&d.prefill_candidates[0], &d.decode_candidates[0]];
    assert!(pair.cost.transfer_ms > 0.0 && prefill.cost.tail_ms > 0.0);
    assert!(
        pair.cost.tail_ms > prefill.cost.tail_ms,
        "{pair:?} {prefill:?}"
    );
}

#[test]
fn decode_terms_are_zero_until_stays_and_steps_are_measured() {
    let mut p = policy(&[(0, Role::Both), (1, Role::Both)]);
    let busy = Load {
        active_decode_blocks: 6_000,
        active_requests: 30,
        ..Load::default()
    };
    p.report_load(WorkerId(0), busy, 0).unwrap();
    let d = p.route("hot", request(200), &[cached(0, 190)], 0).unwrap();
    assert!(d
        .decode_candidates
        .iter()
        .all(|c| c.cost.slowdown_ms == 0.0));
    assert!(d.decode_candidates[0].cost.stall_ms > 0.0);
}

#[test]
fn a_split_picks_the_decode_worker_by_what_it_does_to_its_streams() {
    // Decode worker 0 holds half of the prompt, so less has to move there,
    // but 30 streams would read the request's 600 blocks at every step they
    // share; decode worker 1 is idle.
    let mut p = measured_with_worker_0_busy(
        &[(0, Role::Decode), (2, Role::Prefill), (1, Role::Decode)],
        500,
    );
    let d = p
        .route("long", request(600), &[cached(0, 300)], 2_000)
        .unwrap();
    assert_eq!(d.prefill_worker, Some(WorkerId(2)));
    assert_eq!(d.decode_worker, WorkerId(1));
    let busy = &d.decode_candidates[0];
    assert!(busy.cost.transfer_ms < d.decode_candidates[1].cost.transfer_ms);
    assert!(busy.cost.slowdown_ms > 0.0 && busy.cost.stall_ms == 0.0);
}

/// Two full caches: worker 0's earns hits (a hot prompt, routed there and
/// finished), worker 1's has never been hit. A one-off prompt goes to the
/// cache whose evicted blocks nobody will miss once pollution is priced;
/// without it, the two tie and the hot worker may take it.
#[test]
fn a_one_off_prompt_is_kept_from_a_full_cache_that_earns_hits() {
    let place_one_off = |pollution_weight: f64| {
        let mut p = Policy::new(PolicyConfig {
            pollution_weight,
            ..PolicyConfig::default()
        });
        for id in [0, 1] {
            p.pool
                .upsert_worker(WorkerId(id), Role::Both, 1_000, &Serves::default());
            p.pool.set_cached_blocks(WorkerId(id), 1_000);
        }
        for i in 0..20 {
            let id = format!("hot{i}");
            p.route(&id, request(100), &[cached(0, 100)], 0).unwrap();
            p.pool.release(&id);
        }
        (0..4)
            .map(|i| {
                let id = format!("once{i}");
                let d = p.route(&id, request(100), &[], 0).unwrap();
                p.pool.release(&id);
                d
            })
            .collect::<Vec<_>>()
    };
    let priced = place_one_off(1.0);
    for d in &priced {
        assert_eq!(d.decode_worker, WorkerId(1), "{}", d.reason);
        let hot = d
            .decode_candidates
            .iter()
            .find(|c| c.worker == WorkerId(0))
            .unwrap();
        assert!(hot.cost.pollution_ms > 0.0);
        assert!(d.reason.contains("evicted hits"), "{}", d.reason);
    }
    let unpriced = place_one_off(0.0);
    assert!(unpriced.iter().any(|d| d.decode_worker == WorkerId(0)));
    assert!(unpriced
        .iter()
        .flat_map(|d| &d.decode_candidates)
        .all(|c| c.cost.pollution_ms == 0.0));
}
