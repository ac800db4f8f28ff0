//! The map work an index of engine block ids does, and nothing else, on a
//! trace stream written by `bench/index_bare_maps.py`: a map from sequence
//! hash to node (one insert per new block, one erase per freed one) and,
//! where engines name blocks by ids of their own, a second map from id to
//! node (an insert per new block, a find and an erase per removal). Owners
//! are a 32-bit mask (the stream has 32 workers); no tiers, no interned
//! owner sets, no prefetching. The maps are `hashbrown`'s with the Fx
//! hasher, sized up front: what the work costs done the plain way, not a
//! bound on what a better table can do.
//!
//! Usage: `bare_maps STREAM CAPACITY REPEATS`. Prints one JSON object: the
//! CPU nanoseconds a block of each repeat, with ids equal to the sequence
//! hashes (one map) and with opaque ids (two maps).

use hashbrown::HashMap;
use rustc_hash::FxBuildHasher;

type Map = HashMap<u64, u32, FxBuildHasher>;

/// One event of the stream: each block's sequence hash and engine id.
struct Event {
    worker: u32,
    stored: bool,
    blocks: Vec<(u64, u64)>,
}

fn read_stream(path: &str) -> Vec<Event> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| {
        eprintln!("bare_maps: {path}: {e}");
        std::process::exit(2);
    });
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let long = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let mut events = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let (worker, stored, count) = (word(at), bytes[at + 4] == 1, word(at + 5) as usize);
        at += 9;
        let blocks = (0..count)
            .map(|i| (long(at + 16 * i), long(at + 16 * i + 8)))
            .collect();
        at += 16 * count;
        events.push(Event {
            worker,
            stored,
            blocks,
        });
    }
    events
}

struct Node {
    seq: u64,
    id: u64,
    owners: u32,
}

/// CPU seconds of this process so far.
fn cpu_seconds() -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) };
    now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9
}

/// CPU nanoseconds a block to apply `events`, by engine id (`opaque`) or
/// by sequence hash.
fn apply(events: &[Event], opaque: bool, capacity: usize) -> f64 {
    let mut by_seq = Map::with_capacity_and_hasher(capacity, FxBuildHasher);
    let mut by_id = Map::with_capacity_and_hasher(if opaque { capacity } else { 0 }, FxBuildHasher);
    let mut nodes: Vec<Node> = Vec::new();
    let mut free: Vec<u32> = Vec::new();
    let mut blocks = 0usize;
    let start = cpu_seconds();
    for event in events {
        let bit = 1u32 << (event.worker % 32);
        blocks += event.blocks.len();
        for &(seq, id) in &event.blocks {
            if event.stored {
                let next = free.last().copied().unwrap_or(nodes.len() as u32);
                let index = *by_seq.entry(seq).or_insert(next);
                if index != next {
                    nodes[index as usize].owners |= bit;
                    continue;
                }
                let node = Node {
                    seq,
                    id,
                    owners: bit,
                };
                if free.pop().is_some() {
                    nodes[index as usize] = node;
                } else {
                    nodes.push(node);
                }
                if opaque {
                    by_id.insert(id, index);
                }
                continue;
            }
            let found = if opaque {
                by_id.get(&id)
            } else {
                by_seq.get(&seq)
            };
            let Some(&index) = found else { continue };
            let node = &mut nodes[index as usize];
            node.owners &= !bit;
            if node.owners == 0 {
                by_seq.remove(&node.seq);
                if opaque {
                    by_id.remove(&node.id);
                }
                free.push(index);
            }
        }
    }
    (cpu_seconds() - start) / blocks as f64 * 1e9
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, stream, capacity, repeats] = args.as_slice() else {
        eprintln!("usage: bare_maps STREAM CAPACITY REPEATS");
        std::process::exit(2);
    };
    let capacity: usize = capacity.parse().expect("CAPACITY is a number of blocks");
    let repeats: usize = repeats.parse().expect("REPEATS is a count");
    let events = read_stream(stream);
    let (mut one_map, mut two_maps) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        one_map.push(apply(&events, false, capacity));
        two_maps.push(apply(&events, true, capacity));
    }
    println!(
        "{}",
        serde_json::json!({"one_map_ns": one_map, "two_maps_ns": two_maps})
    );
}
