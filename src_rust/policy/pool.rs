//! The pool a policy chooses from: the registered workers, what each last
//! reported, and the load book of what was routed to them.

use super::book::{Booking, LoadBook};
use super::cost::{Load, Request};
use super::lifetime::Lifetime;
use super::models::{ModelId, Models, Serves};
use super::sessions::{Affinity, SessionKey, Sessions};
use super::{Role, RouteError};
use crate::ids::{SeqHash, WorkerId};
use hashbrown::HashMap;

/// What the router knows of one worker.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerState {
    pub role: Role,
    /// The model names it is routed for (`Models`): its model, and
    /// `model:adapter` for each adapter.
    pub serves: Vec<ModelId>,
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
    models: Models,
    pub(super) book: LoadBook,
    sessions: Sessions,
    /// How long requests stay, in ms and in decode steps.
    pub lifetime: Lifetime,
}

impl Pool {
    /// Adds or updates a worker. One that now serves another model leaves
    /// the old model's pool; its bookings stay until they finish.
    pub fn upsert_worker(
        &mut self,
        worker: WorkerId,
        role: Role,
        capacity_blocks: u64,
        serves: &Serves,
    ) {
        let ids = self.models.serve(serves);
        let state = self.workers.entry(worker).or_insert(WorkerState {
            role,
            serves: Vec::new(),
            capacity_blocks,
            healthy: true,
            reported: Load::default(),
        });
        let previous = std::mem::replace(&mut state.serves, ids);
        state.role = role;
        state.capacity_blocks = capacity_blocks;
        self.models.unserve(&previous);
    }

    /// The blocks the worker's cache holds, by the index: refreshed before
    /// each decision of a policy that prices pollution (`Load::cached_blocks`).
    pub fn set_cached_blocks(&mut self, worker: WorkerId, blocks: u64) {
        if let Some(state) = self.workers.get_mut(&worker) {
            state.reported.cached_blocks = blocks;
        }
    }

    /// Forgets the worker and the sessions last routed to it, and releases
    /// the requests booked on it.
    pub fn remove_worker(&mut self, worker: WorkerId) -> Result<Vec<String>, RouteError> {
        let state = self
            .workers
            .remove(&worker)
            .ok_or(RouteError::UnknownWorker(worker.0))?;
        self.models.unserve(&state.serves);
        self.sessions.forget_worker(worker);
        Ok(self.book.drop_worker(worker))
    }

    /// The model a request names, as the pool knows it, an adapter named by
    /// itself included (`canonical_model`): `UnknownModel` when no
    /// registered worker serves it, `AmbiguousAdapter` when it is the
    /// adapter of several models.
    pub fn model(&self, name: &str) -> Result<ModelId, RouteError> {
        if let Some(id) = self.models.resolve(name) {
            return Ok(id);
        }
        match self.adapter_home(name)? {
            Some((_, id)) => Ok(id),
            None => Err(RouteError::UnknownModel(name.to_owned())),
        }
    }

    /// The `model:adapter` a request that names an adapter by itself means,
    /// when it means exactly one; `AmbiguousAdapter` when several models
    /// have it; None for any other name, which routes (or is refused) as it
    /// is. A request hashes in the namespace of what it means, so that both
    /// names find the same cached blocks.
    pub fn canonical_model(&self, name: &str) -> Result<Option<String>, RouteError> {
        Ok(self.adapter_home(name)?.map(|(home, _)| home.to_owned()))
    }

    /// The one `model:adapter` (and its id) an adapter named by itself
    /// stands for; None when it stands for none, `AmbiguousAdapter` when
    /// for several.
    fn adapter_home(&self, name: &str) -> Result<Option<(&str, ModelId)>, RouteError> {
        match self.models.adapter_homes(name)[..] {
            [] => Ok(None),
            [home] => Ok(Some(home)),
            ref homes => Err(RouteError::AmbiguousAdapter {
                name: name.to_owned(),
                models: homes
                    .iter()
                    .map(|(home, _)| *home)
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// Every model name served, with how many of its workers are routable
    /// now (healthy and decode-capable), sorted by name.
    pub fn models(&self) -> Vec<(String, usize)> {
        self.models
            .names()
            .into_iter()
            .map(|(name, id)| {
                // A prefill worker alone cannot answer a request: only the
                // decode-capable ones make a model routable.
                let healthy = self
                    .workers
                    .values()
                    .filter(|s| s.healthy && s.serves.contains(&id) && s.role != Role::Prefill)
                    .count();
                (name.to_owned(), healthy)
            })
            .collect()
    }

    /// The least prefill still queued on a healthy worker of `model`, in
    /// tokens (booked or reported, whichever is larger): how far behind the
    /// least loaded of them is. None when none is healthy.
    pub fn least_queued_prefill(&self, model: ModelId) -> Option<u64> {
        self.workers
            .iter()
            .filter(|(_, s)| s.healthy && s.serves.contains(&model))
            .map(|(id, _)| self.load(*id).queued_prefill_tokens)
            .min()
    }

    /// Registered workers that serve `model`, healthy or not.
    pub fn serving(&self, model: ModelId) -> usize {
        self.workers
            .values()
            .filter(|s| s.serves.contains(&model))
            .count()
    }

    pub fn set_healthy(&mut self, worker: WorkerId, healthy: bool) -> Result<(), RouteError> {
        self.worker_mut(worker)?.healthy = healthy;
        Ok(())
    }

    pub fn report_load(&mut self, worker: WorkerId, load: Load) -> Result<(), RouteError> {
        let state = self.worker_mut(worker)?;
        state.reported = Load {
            capacity_blocks: state.capacity_blocks,
            cached_blocks: state.reported.cached_blocks,
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

    /// The KV blocks all registered workers can hold together, about the
    /// most distinct blocks their index comes to hold (other tiers and
    /// approximate entries add a few).
    pub fn capacity_blocks(&self) -> u64 {
        self.workers
            .values()
            .fold(0u64, |sum, state| sum.saturating_add(state.capacity_blocks))
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Healthy workers of the request's model with room for its blocks, in
    /// id order: the prefill-role ones when `prefill_pool`, else the
    /// decode-capable ones. The one place a decision is kept to its model.
    pub fn eligible(&self, request: &Request, prefill_pool: bool) -> Vec<WorkerId> {
        let mut out: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, s)| {
                s.healthy
                    && s.serves.contains(&request.model)
                    && s.capacity_blocks >= request.num_blocks
                    && (s.role == Role::Prefill) == prefill_pool
            })
            .map(|(id, _)| *id)
            .collect();
        out.sort_unstable();
        out
    }

    /// Where the session's last request went, if it is remembered.
    pub fn affinity(&self, session: Option<SessionKey>) -> Option<Affinity> {
        self.sessions.get(session?)
    }

    /// Sessions remembered now (at most `MAX_SESSIONS`).
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    pub(super) fn remember(&mut self, session: SessionKey, affinity: Affinity) {
        self.sessions.remember(session, affinity);
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
            cached_blocks: state.reported.cached_blocks,
        }
    }

    pub(super) fn charge(&mut self, request_id: String, booking: Booking, blocks: &[SeqHash]) {
        self.book.charge(request_id, booking, blocks);
    }

    /// The worker's active decode blocks with each block that several of
    /// its booked requests share counted once (`LoadBook::active_blocks`),
    /// or what it reported, whichever is larger.
    pub fn distinct_active_blocks(&self, worker: WorkerId) -> u64 {
        self.book
            .active_blocks(worker)
            .max(self.workers[&worker].reported.active_decode_blocks)
    }

    /// The request's prompt blocks that no request active on the worker
    /// holds yet: what routing it there adds to `distinct_active_blocks`.
    pub fn new_active_blocks(&self, worker: WorkerId, request: &Request) -> u64 {
        request
            .num_blocks
            .saturating_sub(self.book.active_shared(worker, request.blocks))
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
        self.lifetime.released(booking.at_ms);
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
