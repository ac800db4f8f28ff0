//! One worker's hold on one block, packed into 32 bits.

use crate::ids::Tier;

/// Bits of a [`Holding`] that carry the worker slot.
const SLOT_BITS: u32 = 24;
/// The most workers one index can track at once.
pub const MAX_SLOTS: u32 = 1 << SLOT_BITS;
const SLOT_MASK: u32 = MAX_SLOTS - 1;
const TIERS_SHIFT: u32 = SLOT_BITS;
const APPROX_BIT: u32 = 1 << 27;
const THROUGH_ONLY_BIT: u32 = 1 << 28;

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
    pub fn contains(self, tier: Tier) -> bool {
        self.0 & 1 << tier as u8 != 0
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// The fastest tier held; Device for an empty set.
    pub fn best(self) -> Tier {
        Tier::from_index(self.0.trailing_zeros() as u8).unwrap_or(Tier::Device)
    }
}

/// The worker's slot (24 bits), its tiers (3 bits), whether the hold is
/// only predicted by the router (approximate) rather than confirmed by an
/// event, and whether the block is reusable only on the way to a later one
/// (through-only: a prefix that ends at it is not reusable, as when a
/// sliding-window KV group lacks the window before it).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
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
    pub fn is_through_only(self) -> bool {
        self.0 & THROUGH_ONLY_BIT != 0
    }
    pub fn through_only(self, on: bool) -> Self {
        Holding(if on {
            self.0 | THROUGH_ONLY_BIT
        } else {
            self.0 & !THROUGH_ONLY_BIT
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holding_packs_slot_tiers_and_flag() {
        let hold = Holding::confirmed(12345, TierSet::only(Tier::Host).with(Tier::Disk));
        assert_eq!(hold.slot(), 12345);
        assert_eq!(hold.tiers().best(), Tier::Host);
        assert!(hold.tiers().contains(Tier::Disk));
        assert!(!hold.is_approximate());
        assert!(Holding::approximate(7).is_approximate());
        assert_eq!(Holding::approximate(7).slot(), 7);
        let through = hold.through_only(true);
        assert!(through.is_through_only() && !hold.is_through_only());
        assert_eq!(
            (through.slot(), through.tiers()),
            (hold.slot(), hold.tiers())
        );
        assert_eq!(through.through_only(false), hold);
    }
}
