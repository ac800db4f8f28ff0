//! Sizing the index's tables without stalling it.
//!
//! A reservation ([`PrefixTree::reserve`]) remakes a table of up to 2^24
//! homes, 128 MiB. Writing one takes 50–70 ms on this project's 2-core
//! machine, and laying a big index's entries into it more. Done whole under
//! the index's write lock, as it was, every lookup and event batch waited
//! that long, and a router sizing its index at a registration did it on
//! the thread that handled the registration: the service's event loop.
//!
//! So a reservation goes in three steps:
//! 1. under no lock, the blank tables are made: the page faults, nearly
//!    all of the cost while the index is small;
//! 2. under an upgradable read, the entries are laid into them: lookups go
//!    on, event batches wait;
//! 3. under the write lock, the new tables are swapped in.
//!
//! The old tables are freed once the lock is let go. Where the index
//! changed between the plan and step 2 so that a blank is no longer the
//! size the reservation takes (a batch grew a table meanwhile), the round
//! is repeated, and after a few the rest is done under the write lock.
//!
//! [`Sizer`] runs reservations on a thread of its own, so that a router
//! sizing its index at a registration returns at once. The name table,
//! which the first engine id makes small rather than stall that batch, is
//! brought to its reserved size there too. Asks coalesce: one waiting to
//! run is replaced by a later one.

use super::tree::PrefixTree;
use parking_lot::{Condvar, Mutex, RwLock, RwLockUpgradableReadGuard};
use std::sync::Arc;

/// Rounds of building outside the write lock before the rest is done
/// inside it: each round after the first means a batch changed a table's
/// size while the last was built, which a few rounds of growth exhaust.
const ROUNDS: usize = 3;

/// Sizes `tree`'s tables for workers that can hold `capacity_blocks`
/// blocks together, as [`PrefixTree::reserve`] does, holding the write lock
/// only to swap the tables (see the module note).
pub(super) fn reserve(tree: &RwLock<PrefixTree>, capacity_blocks: usize) {
    let homes = tree.read().homes_for(capacity_blocks);
    for _ in 0..ROUNDS {
        // The plan's read lock is let go before the blanks are made: a
        // batch waiting for the write lock behind it would hold up every
        // lookup after it.
        let reservation = tree.read().arena.reservation(homes);
        let blanks = reservation.blanks();
        let reading = tree.upgradable_read();
        let laid = reading.arena.lay_reserved(blanks);
        let mut writing = RwLockUpgradableReadGuard::upgrade(reading);
        let retired = writing.arena.install(laid);
        let done = writing.arena.reservation(homes).remakes_nothing();
        drop(writing);
        drop(retired);
        if done {
            return;
        }
    }
    tree.write().reserve(capacity_blocks);
}

/// What a [`Sizer`] is asked to do.
pub(super) enum Ask {
    /// Size the tables for this many blocks of capacity.
    Capacity(usize),
    /// Bring the tables to the size of the last reservation.
    Refresh,
}

/// Runs reservations on a thread of its own, started at the first ask and
/// ended once the index is dropped.
#[derive(Default)]
pub(super) struct Sizer {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// The capacity of the latest reservation not yet begun.
    capacity: Option<usize>,
    refresh: bool,
    /// Asks made, and how many of them are done.
    asked: u64,
    done: u64,
    started: bool,
    closed: bool,
}

impl Sizer {
    pub(super) fn ask(&self, tree: &Arc<RwLock<PrefixTree>>, ask: Ask) {
        let mut state = self.shared.state.lock();
        match ask {
            Ask::Capacity(capacity) => state.capacity = Some(capacity),
            Ask::Refresh => state.refresh = true,
        }
        state.asked += 1;
        if !state.started {
            state.started = true;
            let (shared, tree) = (Arc::clone(&self.shared), Arc::clone(tree));
            std::thread::Builder::new()
                .name("kvrouter-index-sizing".into())
                .spawn(move || shared.run(&tree))
                .expect("the index's sizing thread starts");
        }
        self.shared.changed.notify_all();
    }

    /// Waits until every ask made so far is done.
    pub(super) fn wait(&self) {
        let mut state = self.shared.state.lock();
        let target = state.asked;
        while state.done < target {
            self.shared.changed.wait(&mut state);
        }
    }
}

impl Drop for Sizer {
    fn drop(&mut self) {
        self.shared.state.lock().closed = true;
        self.shared.changed.notify_all();
    }
}

impl Shared {
    fn run(&self, tree: &RwLock<PrefixTree>) {
        loop {
            let (capacity, ticket) = {
                let mut state = self.state.lock();
                while state.capacity.is_none() && !state.refresh {
                    if state.closed {
                        return;
                    }
                    self.changed.wait(&mut state);
                }
                if state.closed {
                    return;
                }
                state.refresh = false;
                (state.capacity.take(), state.asked)
            };
            let capacity = capacity.unwrap_or_else(|| tree.read().arena.reserved_homes());
            reserve(tree, capacity);
            self.state.lock().done = ticket;
            self.changed.notify_all();
        }
    }
}
