//! The set of workers holding one block, packed small: most blocks are held by
//! one or two workers, so those live inline in the node; larger sets spill
//! into a shared slab.

use crate::ids::Tier;

/// Bits of a [`Holding`] that carry the worker slot.
const SLOT_BITS: u32 = 24;
/// The most workers one index can track at once.
pub const MAX_SLOTS: u32 = 1 << SLOT_BITS;
const SLOT_MASK: u32 = MAX_SLOTS - 1;
const TIERS_SHIFT: u32 = SLOT_BITS;
const APPROX_BIT: u32 = 1 << 27;

/// The tiers a worker holds one block in.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TierSet(u8);

impl TierSet {
    pub fn only(tier: Tier) -> Self {
        TierSet(1 << tier as u8)
    }
    pub fn from_bits(bits: u8) -> Self {
        TierSet(bits & 0b111)
    }
    pub fn bits(self) -> u8 {
        self.0
    }
    pub fn with(self, tier: Tier) -> Self {
        TierSet(self.0 | 1 << tier as u8)
    }
    pub fn without(self, tier: Tier) -> Self {
        TierSet(self.0 & !(1 << tier as u8))
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// The fastest tier held; Device for an empty set.
    pub fn best(self) -> Tier {
        Tier::from_index(self.0.trailing_zeros() as u8).unwrap_or(Tier::Device)
    }
}

/// One worker's hold on one block, packed into 32 bits: the worker's slot
/// (24 bits), its tiers (3 bits) and whether the hold is only predicted by the
/// router (approximate) rather than confirmed by an event.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Holding(u32);

impl Holding {
    pub fn confirmed(slot: u32, tiers: TierSet) -> Self {
        debug_assert!(slot < MAX_SLOTS);
        Holding(slot | (tiers.bits() as u32) << TIERS_SHIFT)
    }
    pub fn approximate(slot: u32) -> Self {
        Holding(Holding::confirmed(slot, TierSet::only(Tier::Device)).0 | APPROX_BIT)
    }
    pub fn slot(self) -> u32 {
        self.0 & SLOT_MASK
    }
    pub fn tiers(self) -> TierSet {
        TierSet::from_bits((self.0 >> TIERS_SHIFT) as u8)
    }
    pub fn is_approximate(self) -> bool {
        self.0 & APPROX_BIT != 0
    }
}

/// Handle of a spilled owner list in the [`SpillSlab`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SpillId(u32);

/// Owner lists of blocks held by more than two workers.
#[derive(Default)]
pub struct SpillSlab {
    lists: Vec<Vec<Holding>>,
    free: Vec<u32>,
}

impl SpillSlab {
    fn alloc(&mut self, list: Vec<Holding>) -> SpillId {
        match self.free.pop() {
            Some(id) => {
                self.lists[id as usize] = list;
                SpillId(id)
            }
            None => {
                self.lists.push(list);
                SpillId(self.lists.len() as u32 - 1)
            }
        }
    }
    fn take(&mut self, id: SpillId) -> Vec<Holding> {
        self.free.push(id.0);
        std::mem::take(&mut self.lists[id.0 as usize])
    }
    fn get(&self, id: SpillId) -> &[Holding] {
        &self.lists[id.0 as usize]
    }
    fn get_mut(&mut self, id: SpillId) -> &mut Vec<Holding> {
        &mut self.lists[id.0 as usize]
    }
}

/// A non-empty set of holdings, at most one per worker slot.
#[derive(Debug)]
pub enum Owners {
    One(Holding),
    Two([Holding; 2]),
    Many(SpillId),
}

/// What [`Owners::remove`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Removal {
    Absent,
    Removed(Holding),
    /// The last holding went; the caller must drop the node.
    Emptied(Holding),
}

impl Owners {
    pub fn as_slice<'a>(&'a self, spill: &'a SpillSlab) -> &'a [Holding] {
        match self {
            Owners::One(h) => std::slice::from_ref(h),
            Owners::Two(pair) => pair,
            Owners::Many(id) => spill.get(*id),
        }
    }

    pub fn get(&self, spill: &SpillSlab, slot: u32) -> Option<Holding> {
        self.as_slice(spill)
            .iter()
            .copied()
            .find(|h| h.slot() == slot)
    }

    /// Inserts `holding`, replacing the same worker's previous one.
    /// Returns the replaced holding.
    pub fn set(&mut self, spill: &mut SpillSlab, holding: Holding) -> Option<Holding> {
        let slot = holding.slot();
        match self {
            Owners::One(h) if h.slot() == slot => Some(std::mem::replace(h, holding)),
            Owners::One(h) => {
                *self = Owners::Two([*h, holding]);
                None
            }
            Owners::Two(pair) => {
                if let Some(h) = pair.iter_mut().find(|h| h.slot() == slot) {
                    return Some(std::mem::replace(h, holding));
                }
                *self = Owners::Many(spill.alloc(vec![pair[0], pair[1], holding]));
                None
            }
            Owners::Many(id) => {
                let list = spill.get_mut(*id);
                if let Some(h) = list.iter_mut().find(|h| h.slot() == slot) {
                    return Some(std::mem::replace(h, holding));
                }
                list.push(holding);
                None
            }
        }
    }

    pub fn remove(&mut self, spill: &mut SpillSlab, slot: u32) -> Removal {
        match self {
            Owners::One(h) if h.slot() == slot => Removal::Emptied(*h),
            Owners::One(_) => Removal::Absent,
            Owners::Two([a, b]) => {
                let (gone, kept) = match (a.slot() == slot, b.slot() == slot) {
                    (true, _) => (*a, *b),
                    (_, true) => (*b, *a),
                    _ => return Removal::Absent,
                };
                *self = Owners::One(kept);
                Removal::Removed(gone)
            }
            Owners::Many(id) => {
                let list = spill.get_mut(*id);
                let Some(pos) = list.iter().position(|h| h.slot() == slot) else {
                    return Removal::Absent;
                };
                let gone = list.swap_remove(pos);
                if list.len() == 2 {
                    let pair = [list[0], list[1]];
                    spill.take(*id);
                    *self = Owners::Two(pair);
                }
                Removal::Removed(gone)
            }
        }
    }

    /// Frees spilled storage; call when the node is dropped.
    pub fn release(&self, spill: &mut SpillSlab) {
        if let Owners::Many(id) = self {
            spill.take(*id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(slot: u32) -> Holding {
        Holding::confirmed(slot, TierSet::only(Tier::Device))
    }

    #[test]
    fn holding_packs_slot_tiers_and_flag() {
        let hold = Holding::confirmed(12345, TierSet::only(Tier::Host).with(Tier::Disk));
        assert_eq!(hold.slot(), 12345);
        assert_eq!(hold.tiers().best(), Tier::Host);
        assert!(!hold.is_approximate());
        assert!(Holding::approximate(7).is_approximate());
        assert_eq!(Holding::approximate(7).slot(), 7);
    }

    #[test]
    fn grows_into_spill_and_shrinks_back() {
        let mut spill = SpillSlab::default();
        let mut owners = Owners::One(h(0));
        for slot in 1..5 {
            assert_eq!(owners.set(&mut spill, h(slot)), None);
        }
        assert_eq!(owners.as_slice(&spill).len(), 5);
        for slot in [4, 0, 2] {
            assert_eq!(owners.remove(&mut spill, slot), Removal::Removed(h(slot)));
        }
        assert!(matches!(owners, Owners::Two(_)));
        assert_eq!(spill.free.len(), 1);
        assert_eq!(owners.remove(&mut spill, 9), Removal::Absent);
        assert_eq!(owners.remove(&mut spill, 1), Removal::Removed(h(1)));
        assert_eq!(owners.remove(&mut spill, 3), Removal::Emptied(h(3)));
    }

    #[test]
    fn set_replaces_the_same_worker() {
        let mut spill = SpillSlab::default();
        let mut owners = Owners::One(h(3));
        let host = Holding::confirmed(3, TierSet::only(Tier::Host));
        assert_eq!(owners.set(&mut spill, host), Some(h(3)));
        assert_eq!(owners.get(&spill, 3), Some(host));
    }
}
