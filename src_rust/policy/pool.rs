//! The pool a policy chooses from: the registered workers, what each last
//! reported, and the load book of what was routed to them.

use super::book::{Booking, LoadBook};
use super::cost::Load;
use super::{Role, RouteError};
use crate::ids::WorkerId;
use hashbrown::HashMap;

/// What the router knows of one worker.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct WorkerState {
    pub role: Role,
    pub capacity_blocks: u64,
    pub healthy: bool,
    /// The worker's own last report (queued prefill tokens, active decode
    /// blocks, active requests); the booked load covers what it has not
    /// reported yet, and the larger of the two counts.
    pub reported: Load,
}

#[derive(Default, Debug)]
pub struct Pool {
    workers: HashMap<WorkerId, WorkerState>,
    pub(super) book: LoadBook,
}

impl Pool {
    pub fn upsert_worker(&mut self, worker: WorkerId, role: Role, capacity_blocks: u64) {
        let state = self.workers.entry(worker).or_insert(WorkerState {
            role,
            capacity_blocks,
            healthy: true,
            reported: Load::default(),
        });
        state.role = role;
        state.capacity_blocks = capacity_blocks;
    }

    /// Forgets the worker and releases the requests booked on it.
    pub fn remove_worker(&mut self, worker: WorkerId) -> Result<Vec<String>, RouteError> {
        self.workers
            .remove(&worker)
            .ok_or(RouteError::UnknownWorker(worker.0))?;
        Ok(self.book.drop_worker(worker))
    }

    pub fn set_healthy(&mut self, worker: WorkerId, healthy: bool) -> Result<(), RouteError> {
        self.worker_mut(worker)?.healthy = healthy;
        Ok(())
    }

    pub fn report_load(&mut self, worker: WorkerId, load: Load) -> Result<(), RouteError> {
        let state = self.worker_mut(worker)?;
        state.reported = Load {
            capacity_blocks: state.capacity_blocks,
            ..load
        };
        Ok(())
    }

    pub fn worker(&self, worker: WorkerId) -> Option<&WorkerState> {
        self.workers.get(&worker)
    }

    /// Every registered worker, in id order.
    pub fn workers(&self) -> Vec<(WorkerId, &WorkerState)> {
        let mut all: Vec<_> = self.workers.iter().map(|(id, s)| (*id, s)).collect();
        all.sort_unstable_by_key(|(id, _)| *id);
        all
    }

    pub fn len(&self) -> usize {
        self.workers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Healthy workers with room for `blocks`, in id order: the prefill-role
    /// ones when `prefill_pool`, else the decode-capable ones.
    pub fn eligible(&self, blocks: u64, prefill_pool: bool) -> Vec<WorkerId> {
        let mut out: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, s)| {
                s.healthy && s.capacity_blocks >= blocks && (s.role == Role::Prefill) == prefill_pool
            })
            .map(|(id, _)| *id)
            .collect();
        out.sort_unstable();
        out
    }

    pub fn book(&self) -> &LoadBook {
        &self.book
    }

    /// Prefill tokens the worker last reported queued, less what finished since.
    pub fn reported_queue_tokens(&self, worker: WorkerId) -> u64 {
        self.workers
            .get(&worker)
            .map_or(0, |s| s.reported.queued_prefill_tokens)
    }

    /// The load a worker is scored with: the larger of booked (by this
    /// router and its peers) and reported. Panics for an unknown worker.
    pub fn load(&self, worker: WorkerId) -> Load {
        let state = &self.workers[&worker];
        let booked = self.book.booked(worker);
        Load {
            queued_prefill_tokens: booked
                .prefill_tokens
                .max(state.reported.queued_prefill_tokens),
            active_decode_blocks: booked
                .decode_blocks
                .max(state.reported.active_decode_blocks),
            active_requests: booked.requests.max(state.reported.active_requests),
            capacity_blocks: state.capacity_blocks,
        }
    }

    pub(super) fn charge(&mut self, request_id: String, booking: Booking) {
        self.book.charge(request_id, booking);
    }

    /// A worker's last report counted the request's work; the report stays
    /// until the next one, so the work done since comes off it here.
    pub fn prefill_done(&mut self, request_id: &str) -> bool {
        let Some((worker, tokens)) = self.book.prefill_done(request_id) else {
            return false;
        };
        self.discount_report(worker, tokens, 0, 0);
        true
    }

    pub fn release(&mut self, request_id: &str) -> bool {
        let Some(booking) = self.book.release(request_id) else {
            return false;
        };
        if booking.prefill_open {
            self.discount_report(booking.prefill_worker, booking.prefill_tokens, 0, 0);
        }
        self.discount_report(booking.decode_worker, 0, booking.decode_blocks, 1);
        true
    }

    fn discount_report(&mut self, worker: WorkerId, tokens: u64, blocks: u64, requests: u64) {
        if let Some(state) = self.workers.get_mut(&worker) {
            let r = &mut state.reported;
            r.queued_prefill_tokens = r.queued_prefill_tokens.saturating_sub(tokens);
            r.active_decode_blocks = r.active_decode_blocks.saturating_sub(blocks);
            r.active_requests = r.active_requests.saturating_sub(requests);
        }
    }

    /// The book of a peer router replica, kept beside this router's own:
    /// scored load counts both. See `LoadBook::set_remote`.
    pub fn book_mut(&mut self) -> &mut LoadBook {
        &mut self.book
    }

    fn worker_mut(&mut self, worker: WorkerId) -> Result<&mut WorkerState, RouteError> {
        self.workers
            .get_mut(&worker)
            .ok_or(RouteError::UnknownWorker(worker.0))
    }
}
