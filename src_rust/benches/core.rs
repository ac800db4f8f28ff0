//! Criterion benches of the core without Python: block hashing, event
//! application and find_matches, on the same shapes as bench/index_bench.py
//! (shared system prompts, multi-turn conversations, 8-512 workers), and a
//! full routing decision (hash, lookup, policy, booking, stats, record).
//!
//! `cargo bench --bench core`; one group with `cargo bench --bench core -- find_matches`.

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use kvrouter_core::hashing::BlockHasher;
use kvrouter_core::ids::{EngineBlockId, LocalHash, SeqHash, Tier, WorkerId};
use kvrouter_core::index::{BlockContent, EventBatch, IndexConfig, KvEvent, PrefixIndex};
use kvrouter_core::policy::{PolicyConfig, Role, Serves};
use kvrouter_core::routing::{Prompt, Router, RouterOptions};
use std::hint::black_box;
use std::time::Duration;

const BLOCK_SIZE: usize = 16;
const VOCAB: u64 = 150_000;

/// splitmix64: a reproducible stream without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn tokens(&mut self, blocks: usize) -> Vec<u32> {
        (0..blocks * BLOCK_SIZE)
            .map(|_| self.below(VOCAB) as u32)
            .collect()
    }
}

/// A run of blocks continuing one path: their tokens and both hashes.
struct Segment {
    tokens: Vec<u32>,
    locals: Vec<LocalHash>,
    seqs: Vec<SeqHash>,
}

impl Segment {
    fn new(rng: &mut Rng, hasher: &BlockHasher, parent: Option<SeqHash>, blocks: usize) -> Self {
        let tokens = rng.tokens(blocks);
        let locals = hasher.local_hashes(&tokens);
        let seqs = kvrouter_core::hashing::chain_all(parent, &locals);
        Segment {
            tokens,
            locals,
            seqs,
        }
    }

    fn last(&self) -> SeqHash {
        *self.seqs.last().expect("segments are non-empty")
    }

    /// A stored event naming blocks by the router's own hashes, carrying tokens.
    fn stored(&self, parent: Option<SeqHash>) -> KvEvent {
        KvEvent::Stored {
            parent: parent.map(|p| EngineBlockId(p.0)),
            block_ids: self.seqs.iter().map(|s| EngineBlockId(s.0)).collect(),
            content: BlockContent::Tokens(self.tokens.clone()),
            tier: Tier::Device,
            namespace_seed: 0,
        }
    }

    /// The same blocks from a foreign engine: opaque ids and local hashes.
    fn stored_foreign(&self, parent: Option<SeqHash>) -> KvEvent {
        KvEvent::Stored {
            parent: parent.map(foreign_id),
            block_ids: self.seqs.iter().map(|&s| foreign_id(s)).collect(),
            content: BlockContent::LocalHashes(self.locals.clone()),
            tier: Tier::Device,
            namespace_seed: 0,
        }
    }
}

/// A foreign engine's id for a block: any injective scheme that is not ours.
fn foreign_id(seq: SeqHash) -> EngineBlockId {
    EngineBlockId(seq.0.rotate_left(17) ^ 0x5bd1_e995)
}

fn batch(worker: u64, seq: &mut [u64], event: KvEvent) -> EventBatch {
    let next = &mut seq[worker as usize];
    *next += 1;
    EventBatch {
        worker: WorkerId(worker),
        seq: *next - 1,
        events: vec![event],
    }
}

/// Multi-turn chat on 32 workers: 8 system prompts of 32-256 blocks; each
/// conversation runs 1-8 turns of 4-48 blocks on one worker, which stores its
/// system prompt on first use.
fn chat_stream(foreign: bool) -> (Vec<EventBatch>, usize) {
    const WORKERS: u64 = 32;
    let hasher = BlockHasher::new(BLOCK_SIZE, 0);
    let mut rng = Rng(7);
    let systems: Vec<Segment> = (0..8)
        .map(|_| {
            let blocks = 32 + rng.below(225) as usize;
            Segment::new(&mut rng, &hasher, None, blocks)
        })
        .collect();
    let mut has_system = vec![[false; 8]; WORKERS as usize];
    let mut seq = vec![0u64; WORKERS as usize];
    let mut batches = Vec::new();
    let mut blocks = 0;
    let event = |segment: &Segment, parent: Option<SeqHash>| {
        if foreign {
            segment.stored_foreign(parent)
        } else {
            segment.stored(parent)
        }
    };
    for _ in 0..2_000 {
        let worker = rng.below(WORKERS);
        let system = rng.below(8) as usize;
        if !has_system[worker as usize][system] {
            has_system[worker as usize][system] = true;
            blocks += systems[system].seqs.len();
            batches.push(batch(worker, &mut seq, event(&systems[system], None)));
        }
        let mut parent = systems[system].last();
        for _ in 0..1 + rng.below(8) {
            let turn_blocks = 4 + rng.below(45) as usize;
            let turn = Segment::new(&mut rng, &hasher, Some(parent), turn_blocks);
            blocks += turn_blocks;
            batches.push(batch(worker, &mut seq, event(&turn, Some(parent))));
            parent = turn.last();
        }
    }
    (batches, blocks)
}

/// The index state and queries of one find_matches size, as in index_bench.py:
/// four shared prefixes of length/4 blocks (each worker holds one, odd workers
/// two) and conversations of length/4-length/2 blocks of history on one worker
/// holding their prefix. A query continues a conversation and pads with new
/// blocks to `length`.
fn match_state(workers: u64, length: usize) -> (PrefixIndex, Vec<Vec<SeqHash>>) {
    let hasher = BlockHasher::new(BLOCK_SIZE, 0);
    let mut rng = Rng(workers * 31 + length as u64);
    let prefixes: Vec<Segment> = (0..4)
        .map(|_| Segment::new(&mut rng, &hasher, None, length / 4))
        .collect();
    let mut seq = vec![0u64; workers as usize];
    let mut batches = Vec::new();
    for worker in 0..workers {
        let mut held = vec![worker as usize % 4];
        if worker % 2 == 1 {
            held.push((worker as usize + 1) % 4);
        }
        for p in held {
            batches.push(batch(worker, &mut seq, prefixes[p].stored(None)));
        }
    }
    let history_mean = 3 * length / 8;
    let conversations = (300_000 / history_mean).clamp(16, 2 * workers as usize);
    let mut queries = Vec::new();
    for c in 0..conversations {
        let p = c % 4;
        let parent = prefixes[p].last();
        let blocks = length / 4 + rng.below(length as u64 / 4) as usize;
        let history = Segment::new(&mut rng, &hasher, Some(parent), blocks);
        // Every worker congruent to p mod 4 holds prefix p.
        let worker = (rng.below(workers / 4) * 4 + p as u64) % workers;
        batches.push(batch(worker, &mut seq, history.stored(Some(parent))));
        if queries.len() < 16 {
            let mut query: Vec<SeqHash> = prefixes[p].seqs.clone();
            query.extend(&history.seqs);
            query.extend((query.len()..length).map(|_| SeqHash(rng.next())));
            queries.push(query);
        }
    }
    let index = PrefixIndex::new(IndexConfig::default());
    for outcome in index.apply_many(&batches, false) {
        outcome.expect("setup events are well formed");
    }
    (index, queries)
}

fn hashing(c: &mut Criterion) {
    let mut group = c.benchmark_group("hashing");
    let hasher = BlockHasher::new(BLOCK_SIZE, 0);
    let mut rng = Rng(1);
    for tokens in [1_024, 16_384, 131_072] {
        let input = rng.tokens(tokens / BLOCK_SIZE);
        group.throughput(Throughput::Elements(tokens as u64));
        group.bench_with_input(
            BenchmarkId::new("seq_hashes", tokens),
            &input,
            |b, input| b.iter(|| hasher.seq_hashes(black_box(input))),
        );
    }
    group.finish();
}

fn apply(c: &mut Criterion) {
    let mut group = c.benchmark_group("apply_many");
    group.sample_size(20);
    for (name, foreign) in [
        ("tokens, own ids", false),
        ("local hashes, foreign ids", true),
    ] {
        let (batches, blocks) = chat_stream(foreign);
        group.throughput(Throughput::Elements(blocks as u64));
        group.bench_function(name, |b| {
            b.iter_batched(
                || PrefixIndex::new(IndexConfig::default()),
                |index| {
                    index.apply_many(black_box(&batches), false);
                    index
                },
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

fn find_matches(c: &mut Criterion) {
    let mut group = c.benchmark_group("find_matches");
    group.sample_size(30);
    for length in [128, 1_024, 8_192] {
        for workers in [8, 64, 512] {
            let (index, queries) = match_state(workers, length);
            group.throughput(Throughput::Elements(length as u64));
            let id = BenchmarkId::new(format!("{workers} workers"), length);
            let mut next = 0;
            group.bench_function(id, |b| {
                b.iter(|| {
                    next = (next + 1) % queries.len();
                    index.find_matches(black_box(&queries[next]), false)
                })
            });
        }
    }
    group.finish();
}

/// 32 workers, each holding one of 4 shared prefixes (half the prompt);
/// the prompts continue a prefix with tokens no worker holds.
fn decision_state(tokens: usize) -> (PrefixIndex, Router, Vec<Vec<u32>>) {
    let workers = 32u64;
    let blocks = tokens / BLOCK_SIZE;
    let hasher = BlockHasher::new(BLOCK_SIZE, 0);
    let mut rng = Rng(tokens as u64);
    let prefixes: Vec<Segment> = (0..4)
        .map(|_| Segment::new(&mut rng, &hasher, None, blocks / 2))
        .collect();
    let mut seq = vec![0u64; workers as usize];
    let batches: Vec<EventBatch> = (0..workers)
        .map(|w| batch(w, &mut seq, prefixes[w as usize % 4].stored(None)))
        .collect();
    let index = PrefixIndex::new(IndexConfig::default());
    for outcome in index.apply_many(&batches, false) {
        outcome.expect("setup events are well formed");
    }
    let options = RouterOptions {
        log_decisions: true,
        ..RouterOptions::default()
    };
    let router = Router::new(BLOCK_SIZE as u64, PolicyConfig::default(), options)
        .expect("default settings are valid");
    router.with_pool(|pool| {
        for w in 0..workers {
            pool.upsert_worker(WorkerId(w), Role::Both, 1 << 20, &Serves::default());
        }
    });
    let prompts = (0..16)
        .map(|p| {
            let mut prompt = prefixes[p % 4].tokens.clone();
            prompt.extend(rng.tokens(blocks - blocks / 2));
            prompt
        })
        .collect();
    (index, router, prompts)
}

fn decision(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision");
    group.sample_size(30);
    for tokens in [4_096, 131_072] {
        let (index, router, prompts) = decision_state(tokens);
        group.throughput(Throughput::Elements(tokens as u64));
        let mut next = 0usize;
        group.bench_function(BenchmarkId::new("route, 32 workers", tokens), |b| {
            b.iter(|| {
                next += 1;
                let prompt = Prompt::Tokens {
                    tokens: &prompts[next % prompts.len()],
                    namespace: "",
                };
                let routed = router.route(&index, "bench", "", "", black_box(prompt), 0);
                router.release("bench");
                if next.is_multiple_of(1024) {
                    router.take_records();
                }
                routed
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = core;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = hashing, apply, find_matches, decision
}
criterion_main!(core);
