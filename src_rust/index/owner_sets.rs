//! Interned owner sets. Most blocks along a cached prefix are held by the same
//! workers, so each node stores only the id of a shared, reference-counted
//! set of holdings. Storing a block is a memoized set transition, and a lookup
//! only reconciles worker depths where the set id changes along the path.

use super::holding::Holding;
use hashbrown::HashTable;
use rustc_hash::{FxHashMap, FxHasher};
use std::hash::{Hash, Hasher};

/// Id of an interned set of holdings; `SetId::EMPTY` is the empty set.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct SetId(pub u32);

impl SetId {
    pub const EMPTY: SetId = SetId(0);
}

/// A set transition: add-or-replace a holding, or remove a worker slot.
#[derive(Copy, Clone, PartialEq, Eq, Hash)]
enum Change {
    Put(Holding),
    Drop(u32),
}

struct OwnerSet {
    /// Sorted by slot, at most one holding per slot.
    holdings: Box<[Holding]>,
    /// Nodes using this set.
    refs: u32,
}

pub struct OwnerSets {
    sets: Vec<OwnerSet>,
    by_content: HashTable<u32>,
    free: Vec<u32>,
    transitions: FxHashMap<(SetId, Change), SetId>,
    /// The last transition taken: an event's blocks mostly take the same one
    /// in a row (a new block joins the worker's set, a removed one leaves it).
    last: Option<((SetId, Change), SetId)>,
    unreferenced: usize,
}

fn content_hash(holdings: &[Holding]) -> u64 {
    let mut hasher = FxHasher::default();
    holdings.hash(&mut hasher);
    hasher.finish()
}

impl Default for OwnerSets {
    fn default() -> Self {
        let empty = OwnerSet {
            holdings: Box::new([]),
            refs: 0,
        };
        OwnerSets {
            sets: vec![empty],
            by_content: HashTable::new(),
            free: Vec::new(),
            transitions: FxHashMap::default(),
            last: None,
            unreferenced: 0,
        }
    }
}

impl OwnerSets {
    pub fn holdings(&self, set: SetId) -> &[Holding] {
        &self.sets[set.0 as usize].holdings
    }

    pub fn get(&self, set: SetId, slot: u32) -> Option<Holding> {
        let holdings = self.holdings(set);
        holdings
            .binary_search_by_key(&slot, |h| h.slot())
            .ok()
            .map(|i| holdings[i])
    }

    /// `set` with `holding` added, replacing the same worker's previous one.
    pub fn with(&mut self, set: SetId, holding: Holding) -> SetId {
        self.transition(set, Change::Put(holding))
    }

    /// `set` without the worker in `slot`.
    pub fn without(&mut self, set: SetId, slot: u32) -> SetId {
        self.transition(set, Change::Drop(slot))
    }

    /// A node starts using `set`.
    pub fn acquire(&mut self, set: SetId) {
        if set == SetId::EMPTY {
            return;
        }
        let entry = &mut self.sets[set.0 as usize];
        if entry.refs == 0 {
            self.unreferenced -= 1;
        }
        entry.refs += 1;
    }

    /// A node stops using `set`.
    pub fn release(&mut self, set: SetId) {
        if set == SetId::EMPTY {
            return;
        }
        let entry = &mut self.sets[set.0 as usize];
        entry.refs -= 1;
        if entry.refs == 0 {
            self.unreferenced += 1;
        }
    }

    /// Moves a node from `old` to `new`.
    pub fn replace(&mut self, old: SetId, new: SetId) {
        self.acquire(new);
        self.release(old);
    }

    /// Frees the sets no node uses, once they outnumber the used ones. Call
    /// only when every set id in use is held by a node.
    pub fn collect_garbage(&mut self) {
        let live = self.sets.len() - self.free.len() - self.unreferenced;
        if self.unreferenced < 1024 || self.unreferenced < live {
            return;
        }
        self.transitions.clear();
        self.last = None;
        for id in 1..self.sets.len() as u32 {
            let entry = &mut self.sets[id as usize];
            if entry.refs == 0 && !entry.holdings.is_empty() {
                let hash = content_hash(&entry.holdings);
                let holdings = std::mem::take(&mut entry.holdings);
                if let Ok(found) = self.by_content.find_entry(hash, |&other| other == id) {
                    found.remove();
                }
                drop(holdings);
                self.free.push(id);
            }
        }
        self.unreferenced = 0;
    }

    /// Sets interned now (used or not).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.sets.len() - self.free.len()
    }

    #[inline]
    fn transition(&mut self, set: SetId, change: Change) -> SetId {
        let key = (set, change);
        match self.last {
            Some((last, next)) if last == key => next,
            _ => {
                let next = self.lookup_transition(key);
                self.last = Some((key, next));
                next
            }
        }
    }

    fn lookup_transition(&mut self, (set, change): (SetId, Change)) -> SetId {
        if let Some(&next) = self.transitions.get(&(set, change)) {
            return next;
        }
        let mut holdings = self.holdings(set).to_vec();
        match change {
            Change::Put(holding) => {
                match holdings.binary_search_by_key(&holding.slot(), |h| h.slot()) {
                    Ok(i) => holdings[i] = holding,
                    Err(i) => holdings.insert(i, holding),
                }
            }
            Change::Drop(slot) => {
                if let Ok(i) = holdings.binary_search_by_key(&slot, |h| h.slot()) {
                    holdings.remove(i);
                }
            }
        }
        let next = self.intern(holdings);
        self.transitions.insert((set, change), next);
        next
    }

    fn intern(&mut self, holdings: Vec<Holding>) -> SetId {
        if holdings.is_empty() {
            return SetId::EMPTY;
        }
        let hash = content_hash(&holdings);
        let sets = &self.sets;
        if let Some(&id) = self
            .by_content
            .find(hash, |&id| *sets[id as usize].holdings == *holdings)
        {
            return SetId(id);
        }
        let entry = OwnerSet {
            holdings: holdings.into_boxed_slice(),
            refs: 0,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.sets[id as usize] = entry;
                id
            }
            None => {
                self.sets.push(entry);
                self.sets.len() as u32 - 1
            }
        };
        self.unreferenced += 1;
        let sets = &self.sets;
        self.by_content.insert_unique(hash, id, |&other| {
            content_hash(&sets[other as usize].holdings)
        });
        SetId(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Tier;
    use crate::index::holding::TierSet;

    fn h(slot: u32) -> Holding {
        Holding::confirmed(slot, TierSet::only(Tier::Device))
    }

    #[test]
    fn equal_contents_share_one_id() {
        let mut sets = OwnerSets::default();
        let a = sets.with(SetId::EMPTY, h(1));
        let ab = sets.with(a, h(2));
        let b = sets.with(SetId::EMPTY, h(2));
        assert_eq!(sets.with(b, h(1)), ab);
        assert_eq!(sets.holdings(ab), &[h(1), h(2)]);
        assert_eq!(sets.without(ab, 2), a);
        assert_eq!(sets.without(a, 1), SetId::EMPTY);
    }

    #[test]
    fn put_replaces_the_same_worker() {
        let mut sets = OwnerSets::default();
        let device = sets.with(SetId::EMPTY, h(3));
        let host = Holding::confirmed(3, TierSet::only(Tier::Host));
        let replaced = sets.with(device, host);
        assert_eq!(sets.get(replaced, 3), Some(host));
        assert_eq!(sets.holdings(replaced).len(), 1);
    }

    #[test]
    fn unused_sets_are_collected() {
        let mut sets = OwnerSets::default();
        let kept = sets.with(SetId::EMPTY, h(0));
        sets.acquire(kept);
        for slot in 1..3000 {
            sets.with(SetId::EMPTY, h(slot));
        }
        sets.collect_garbage();
        assert_eq!(sets.len(), 2);
        assert_eq!(sets.holdings(kept), &[h(0)]);
        let again = sets.with(SetId::EMPTY, h(7));
        assert_eq!(sets.holdings(again), &[h(7)]);
    }
}
