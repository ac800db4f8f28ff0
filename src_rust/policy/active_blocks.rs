//! The distinct prompt blocks of the requests booked on each worker, by
//! block hash with one reference per request: a prefix that several active
//! requests share is one set of blocks in the worker's memory, and is
//! counted once, as Dynamo's KV router counts it (its `ActiveSequences`).
//! Only the `dynamo` baseline reads it, so only its bookings carry hashes.

use crate::ids::{SeqHash, WorkerId};
use hashbrown::HashMap;

#[derive(Default, Debug)]
pub struct ActiveBlocks {
    per_worker: HashMap<WorkerId, Held>,
}

#[derive(Default, Debug)]
struct Held {
    /// References per block hash.
    refs: HashMap<SeqHash, u32>,
    /// Blocks of the bookings added, counted once per request: what the
    /// load book's per-request total holds for them.
    booked: u64,
}

impl ActiveBlocks {
    pub fn add(&mut self, worker: WorkerId, blocks: &[SeqHash]) {
        if blocks.is_empty() {
            return;
        }
        let held = self.per_worker.entry(worker).or_default();
        held.booked += blocks.len() as u64;
        for &block in blocks {
            *held.refs.entry(block).or_default() += 1;
        }
    }

    /// Drops one request's references; a block no request holds is gone.
    pub fn remove(&mut self, worker: WorkerId, blocks: &[SeqHash]) {
        let Some(held) = self.per_worker.get_mut(&worker) else {
            return;
        };
        held.booked -= blocks.len() as u64;
        for block in blocks {
            if let Some(refs) = held.refs.get_mut(block) {
                *refs -= 1;
                if *refs == 0 {
                    held.refs.remove(block);
                }
            }
        }
        if held.refs.is_empty() {
            self.per_worker.remove(&worker);
        }
    }

    /// Distinct blocks the worker's hashed bookings hold.
    pub fn distinct(&self, worker: WorkerId) -> u64 {
        self.per_worker
            .get(&worker)
            .map_or(0, |held| held.refs.len() as u64)
    }

    /// Blocks of the hashed bookings, each request's counted in full.
    pub fn booked(&self, worker: WorkerId) -> u64 {
        self.per_worker.get(&worker).map_or(0, |held| held.booked)
    }

    /// How many of `blocks` some active request on the worker already holds.
    pub fn shared(&self, worker: WorkerId, blocks: &[SeqHash]) -> u64 {
        self.per_worker.get(&worker).map_or(0, |held| {
            blocks.iter().filter(|b| held.refs.contains_key(*b)).count() as u64
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(range: std::ops::Range<u64>) -> Vec<SeqHash> {
        range.map(SeqHash).collect()
    }

    #[test]
    fn a_shared_prefix_counts_once_until_its_last_request_leaves() {
        let mut active = ActiveBlocks::default();
        let w = WorkerId(1);
        let prefix = hashes(0..100);
        let requests: Vec<Vec<SeqHash>> = (0..8u64)
            .map(|i| {
                let mut blocks = prefix.clone();
                blocks.extend(hashes(1000 + 10 * i..1000 + 10 * i + 10));
                blocks
            })
            .collect();
        for blocks in &requests {
            active.add(w, blocks);
        }
        assert_eq!(active.distinct(w), 100 + 8 * 10);
        assert_eq!(active.booked(w), 8 * 110);
        assert_eq!(active.shared(w, &hashes(50..150)), 50);
        for blocks in &requests[..7] {
            active.remove(w, blocks);
        }
        assert_eq!(active.distinct(w), 110);
        active.remove(w, &requests[7]);
        assert_eq!((active.distinct(w), active.booked(w)), (0, 0));
        assert_eq!(active.shared(w, &prefix), 0);
        assert!(active.per_worker.is_empty());
    }

    #[test]
    fn workers_are_counted_apart() {
        let mut active = ActiveBlocks::default();
        active.add(WorkerId(1), &hashes(0..10));
        active.add(WorkerId(2), &hashes(0..10));
        active.remove(WorkerId(1), &hashes(0..10));
        assert_eq!(active.distinct(WorkerId(1)), 0);
        assert_eq!(active.distinct(WorkerId(2)), 10);
    }

    /// Any order of adds and removes of overlapping prompts leaves exactly
    /// the union of the prompts still active.
    #[test]
    fn distinct_is_the_union_of_the_active_prompts() {
        let mut rng = crate::policy::Rng::new(7);
        let mut active = ActiveBlocks::default();
        let w = WorkerId(0);
        let mut live: Vec<Vec<SeqHash>> = Vec::new();
        for _ in 0..2_000 {
            if live.is_empty() || !rng.next_u64().is_multiple_of(3) {
                let start = rng.next_u64() % 50;
                let len = 1 + rng.next_u64() % 40;
                let blocks = hashes(start..start + len);
                active.add(w, &blocks);
                live.push(blocks);
            } else {
                let at = (rng.next_u64() % live.len() as u64) as usize;
                active.remove(w, &live.swap_remove(at));
            }
            let union: std::collections::HashSet<SeqHash> =
                live.iter().flatten().copied().collect();
            assert_eq!(active.distinct(w), union.len() as u64);
            assert_eq!(
                active.booked(w),
                live.iter().map(|b| b.len() as u64).sum::<u64>()
            );
        }
    }
}
