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
//! which the first engine ids make with room for their batch alone rather
//! than stall that batch, is brought to its reserved size there too. Asks coalesce: one waiting to
//! run is replaced by a later one.

use super::tree::PrefixTree;
use parking_lot::{Condvar, Mutex, RwLock, RwLockUpgradableReadGuard};
use std::sync::Arc;

/// Rounds of building outside the write lock before the rest is done
/// inside it: each round after the first means a batch changed a table's
/// size while the last was built, which a few rounds of growth exhaust.
const ROUNDS: usize = 3;

/// A reservation to make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ask {
    /// For workers that can hold this many blocks together.
    Capacity(usize),
    /// The last one again: what a name table made since it needs.
    Current,
}

impl Ask {
    /// The homes it gives each table, read under the lock `tree` is seen
    /// by, so that `Current` is the reservation in force then.
    fn homes(self, tree: &PrefixTree) -> usize {
        match self {
            Ask::Capacity(capacity_blocks) => tree.homes_for(capacity_blocks),
            Ask::Current => tree.arena.reserved_homes(),
        }
    }
}

/// Makes the reservation `ask` as [`PrefixTree::reserve`] does, holding the
/// write lock only to swap the tables (see the module note). Reservations
/// made at once from several threads take effect in the order they swap.
pub(super) fn reserve(tree: &RwLock<PrefixTree>, ask: Ask) {
    for _ in 0..ROUNDS {
        // The plan's read lock is let go before the blanks are made: a
        // batch waiting for the write lock behind it would hold up every
        // lookup after it.
        let plan = {
            let tree = tree.read();
            tree.arena.reservation(ask.homes(&tree))
        };
        let blanks = plan.blanks();
        let reading = tree.upgradable_read();
        let homes = ask.homes(&reading);
        let laid = reading.arena.lay_reserved(homes, blanks);
        let mut writing = RwLockUpgradableReadGuard::upgrade(reading);
        let retired = writing.arena.install(homes, laid);
        let left = writing.arena.reservation(homes);
        if left == plan && !left.remakes_nothing() {
            // The blanks were of the right size, so the entries ran past a
            // table's end: another round would fail alike.
            writing.arena.reserve(homes);
        }
        let done = left == plan || left.remakes_nothing();
        drop(writing);
        drop(retired);
        if done {
            return;
        }
    }
    let mut writing = tree.write();
    let homes = ask.homes(&writing);
    writing.arena.reserve(homes);
}

/// Runs reservations on a thread of its own, started at the first ask and
/// ended once the index is dropped.
pub(super) struct Sizer {
    tree: Arc<RwLock<PrefixTree>>,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// The latest ask not yet begun; a later one replaces it, except that
    /// `Current` does not replace a `Capacity` (which makes a name table
    /// reserved too).
    waiting: Option<Ask>,
    /// Asks made, and how many of them are done.
    asked: u64,
    done: u64,
    started: bool,
    /// The index is dropped: the thread ends.
    closed: bool,
    /// The thread could not start, or died: asks are dropped, and the
    /// tables grow as they fill.
    failed: bool,
}

impl Sizer {
    pub(super) fn new(tree: &Arc<RwLock<PrefixTree>>) -> Self {
        Sizer {
            tree: Arc::clone(tree),
            shared: Arc::default(),
        }
    }

    /// Has `ask` made on the sizing thread. Takes no lock on the tree, so
    /// it may be called with the tree locked.
    pub(super) fn ask(&self, ask: Ask) {
        let mut state = self.shared.state.lock();
        if state.failed {
            return;
        }
        if !(ask == Ask::Current && matches!(state.waiting, Some(Ask::Capacity(_)))) {
            state.waiting = Some(ask);
        }
        state.asked += 1;
        if !state.started {
            let (shared, tree) = (Arc::clone(&self.shared), Arc::clone(&self.tree));
            let spawned = std::thread::Builder::new()
                .name("kvrouter-index-sizing".into())
                .spawn(move || shared.run(&tree));
            state.started = spawned.is_ok();
            state.failed = spawned.is_err();
        }
        self.shared.changed.notify_all();
    }

    /// Waits until every ask made so far is done (or the thread is gone).
    pub(super) fn wait(&self) {
        let mut state = self.shared.state.lock();
        let target = state.asked;
        while state.done < target && !state.failed {
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

/// Marks the sizer failed if its thread unwinds, so that no caller waits
/// for it forever.
struct FailOnUnwind<'a>(&'a Shared);

impl Drop for FailOnUnwind<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.state.lock().failed = true;
            self.0.changed.notify_all();
        }
    }
}

impl Shared {
    fn run(&self, tree: &RwLock<PrefixTree>) {
        let _fail_on_unwind = FailOnUnwind(self);
        loop {
            let (ask, ticket) = {
                let mut state = self.state.lock();
                while state.waiting.is_none() && !state.closed {
                    self.changed.wait(&mut state);
                }
                match state.waiting.take() {
                    Some(ask) if !state.closed => (ask, state.asked),
                    _ => return,
                }
            };
            reserve(tree, ask);
            self.state.lock().done = ticket;
            self.changed.notify_all();
        }
    }
}
