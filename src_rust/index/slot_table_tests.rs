//! Property tests: the slot table against a plain map, with hashes drawn
//! from a few values so that runs, equal tags and shifts are common, and
//! with uniform hashes over enough keys that the table doubles several
//! times between removals and remaps.

use super::slot_table::{BlankTable, SlotTable};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// A slot table, the caller's side of it (slot -> key) and the map it must
/// agree with, under one hash of the keys.
struct Checked {
    table: SlotTable,
    keys: Vec<Option<u64>>,
    model: BTreeMap<u64, u32>,
    hash: fn(u64) -> u64,
}

impl Checked {
    fn new(hash: fn(u64) -> u64) -> Self {
        Checked {
            table: SlotTable::default(),
            keys: Vec::new(),
            model: BTreeMap::new(),
            hash,
        }
    }

    /// Reserves as the index's sizing does: the table laid into a blank
    /// made apart, swapped in whole.
    fn reserve_laid(&mut self, homes: usize) {
        match self.table.resize_for(homes) {
            Some(bits) => match self.table.laid_into(homes, BlankTable::new(bits)) {
                Some(table) => self.table = table,
                None => self.table.reserve(homes),
            },
            None => self.table.keep_reserved(homes),
        }
    }

    fn find(&self, key: u64) -> Option<u32> {
        self.table.find((self.hash)(key), |slot| {
            self.keys[slot as usize] == Some(key)
        })
    }

    fn insert(&mut self, key: u64) {
        if !self.model.contains_key(&key) {
            let slot = self.keys.len() as u32;
            self.keys.push(Some(key));
            self.table.insert((self.hash)(key), slot);
            self.model.insert(key, slot);
        }
    }

    /// Inserts `key` unless present, in one call; whether the table and the
    /// map agree on the slot it already had.
    fn find_or_insert(&mut self, key: u64) -> bool {
        let slot = self.keys.len() as u32;
        let keys = &self.keys;
        let found = self
            .table
            .find_or_insert((self.hash)(key), slot, |s| keys[s as usize] == Some(key));
        if found.is_none() {
            self.keys.push(Some(key));
            self.model.insert(key, slot);
            return true;
        }
        found == self.model.get(&key).copied()
    }

    /// Whether the table and the map agree that `key` was there.
    fn remove(&mut self, key: u64) -> bool {
        let slot = self.model.remove(&key);
        let removed = slot.is_some_and(|slot| self.table.remove((self.hash)(key), slot));
        if let Some(slot) = slot {
            self.keys[slot as usize] = None;
        }
        removed == slot.is_some()
    }

    /// Drops every key whose slot is a multiple of `every`, renumbering the rest.
    fn remap(&mut self, every: u32) {
        let mut next = 0u32;
        let renumber: Vec<Option<u32>> = (0..self.keys.len() as u32)
            .map(|slot| {
                (self.keys[slot as usize].is_some() && slot % every != 0).then(|| {
                    next += 1;
                    next - 1
                })
            })
            .collect();
        self.table.remap(|slot| renumber[slot as usize]);
        self.keys = (0..self.keys.len())
            .filter(|&slot| renumber[slot].is_some())
            .map(|slot| self.keys[slot])
            .collect();
        self.model.retain(|_, slot| match renumber[*slot as usize] {
            Some(new) => {
                *slot = new;
                true
            }
            None => false,
        });
    }
}

#[derive(Clone, Debug)]
enum Op {
    Insert(u64),
    FindOrInsert(u64),
    Remove(u64),
    /// Drops every key whose slot is a multiple of the value, renumbering the rest.
    Remap(u32),
    /// Gives the table at least this many homes.
    Reserve(usize),
    /// The same, the table laid into a blank made apart.
    ReserveLaid(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u64..300;
    prop_oneof![
        3 => key.clone().prop_map(Op::Insert),
        3 => key.clone().prop_map(Op::FindOrInsert),
        3 => key.prop_map(Op::Remove),
        1 => (2u32..5).prop_map(Op::Remap),
        1 => (0usize..400).prop_map(Op::Reserve),
        1 => (0usize..400).prop_map(Op::ReserveLaid),
    ]
}

/// Few distinct tags, spread over the whole tag range, so homes collide.
fn hash_of(key: u64) -> u64 {
    (key % 23).wrapping_mul(0x0B00_0000_0000_0000) | key
}

/// Five tags at the top of the range: every key's home is the last, as
/// with ids crafted to share it, so that the overflow runs into the tail.
fn last_home_hash(key: u64) -> u64 {
    u64::from(u32::MAX - (key % 5) as u32) << 32 | key
}

/// A uniform hash of a key, as sequence hashes are.
fn uniform_hash(key: u64) -> u64 {
    let x = (key ^ 0x5851_F42D_4C95_7F2D).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 31)
}

#[derive(Clone, Debug)]
enum RangeOp {
    /// Inserts the keys `start..start + count` not yet present.
    Insert(u64, u64),
    /// Removes the keys `start..start + count` that are present.
    Remove(u64, u64),
    /// Drops every key whose slot is a multiple of the value, renumbering the rest.
    Remap(u32),
    /// Gives the table at least this many homes.
    Reserve(usize),
    /// The same, the table laid into a blank made apart.
    ReserveLaid(usize),
}

fn range_op() -> impl Strategy<Value = RangeOp> {
    let start = 0u64..12_000;
    prop_oneof![
        8 => (start.clone(), 1u64..200).prop_map(|(s, n)| RangeOp::Insert(s, n)),
        3 => (start, 1u64..200).prop_map(|(s, n)| RangeOp::Remove(s, n)),
        1 => (2u32..6).prop_map(RangeOp::Remap),
        1 => (0usize..16_000).prop_map(RangeOp::Reserve),
        1 => (0usize..16_000).prop_map(RangeOp::ReserveLaid),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn slot_table_matches_a_map(
        ops in proptest::collection::vec(op(), 1..400),
        hash in prop_oneof![Just(hash_of as fn(u64) -> u64), Just(last_home_hash as fn(u64) -> u64)],
    ) {
        let mut checked = Checked::new(hash);
        for op in ops {
            match op {
                Op::Insert(key) => checked.insert(key),
                Op::FindOrInsert(key) => prop_assert!(checked.find_or_insert(key)),
                Op::Remove(key) => prop_assert!(checked.remove(key)),
                Op::Remap(every) => checked.remap(every),
                Op::Reserve(homes) => checked.table.reserve(homes),
                Op::ReserveLaid(homes) => checked.reserve_laid(homes),
            }
            prop_assert_eq!(checked.table.len(), checked.model.len());
            for key in 0..300u64 {
                prop_assert_eq!(checked.find(key), checked.model.get(&key).copied(), "key {}", key);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Thousands of keys, so that the table doubles from 16 homes to
    /// thousands, and remaps shrink it again.
    #[test]
    fn slot_table_matches_a_map_across_growth(ops in proptest::collection::vec(range_op(), 1..120)) {
        let mut checked = Checked::new(uniform_hash);
        for op in ops {
            match op {
                RangeOp::Insert(start, count) => {
                    for key in start..start + count {
                        prop_assert_eq!(checked.find(key), checked.model.get(&key).copied());
                        if key % 2 == 0 {
                            checked.insert(key);
                        } else {
                            prop_assert!(checked.find_or_insert(key));
                        }
                    }
                }
                RangeOp::Remove(start, count) => {
                    for key in start..start + count {
                        prop_assert!(checked.remove(key));
                    }
                }
                RangeOp::Remap(every) => checked.remap(every),
                RangeOp::Reserve(homes) => checked.table.reserve(homes),
                RangeOp::ReserveLaid(homes) => checked.reserve_laid(homes),
            }
            prop_assert_eq!(checked.table.len(), checked.model.len());
        }
        for key in 0..12_200u64 {
            prop_assert_eq!(checked.find(key), checked.model.get(&key).copied(), "key {}", key);
        }
    }
}

/// A table given its homes takes 7/8 of them in entries without growing,
/// the stall a doubling would be, and keeps them when the entries go, so
/// that it fills again without growing either; one entry more doubles it.
#[test]
fn a_reserved_table_never_grows_under_its_reservation() {
    const HOMES: usize = 1 << 16;
    let fill = (HOMES * 7 / 8) as u64;
    let mut checked = Checked::new(uniform_hash);
    checked.table.reserve(HOMES);
    let reserved = checked.table.heap_bytes();
    assert_eq!(reserved, (HOMES + 64) * 8);
    for round in 0..2 {
        for key in 0..fill {
            checked.insert(key);
        }
        assert_eq!(checked.table.heap_bytes(), reserved, "round {round}");
        for key in 0..fill {
            assert!(checked.remove(key));
        }
        checked.remap(2);
        assert_eq!(checked.table.heap_bytes(), reserved, "round {round}");
    }
    for key in 0..=fill {
        checked.insert(key);
    }
    assert_eq!(checked.table.heap_bytes(), (2 * HOMES + 64) * 8);

    let mut unreserved = Checked::new(uniform_hash);
    for key in 0..fill {
        unreserved.insert(key);
    }
    for key in 0..fill {
        assert!(unreserved.remove(key));
    }
    unreserved.remap(2);
    assert!(unreserved.table.heap_bytes() < reserved / 1000);
}

/// A smaller reservation shrinks the table at once, but never below what
/// its entries need at 7/8 full.
#[test]
fn a_smaller_reservation_shrinks_the_table_to_what_its_entries_need() {
    let mut checked = Checked::new(uniform_hash);
    checked.table.reserve(1 << 20);
    for key in 0..20_000u64 {
        checked.insert(key);
    }
    checked.table.reserve(16);
    assert_eq!(checked.table.heap_bytes(), ((1 << 15) + 64) * 8);
    for key in 0..20_000u64 {
        assert_eq!(checked.find(key), checked.model.get(&key).copied());
    }
    checked.table.reserve(1 << 17);
    assert_eq!(checked.table.heap_bytes(), ((1 << 17) + 64) * 8);
    checked.table.reserve(1 << 16);
    assert_eq!(checked.table.heap_bytes(), ((1 << 17) + 64) * 8);
}

/// A table of millions of entries lies in memory advised for huge pages
/// (the VmFlags of the mapping that holds its middle include `hg`), but it
/// was written before it was advised: its first touch took small pages, so
/// on a kernel that gives huge pages only where asked (`madvise`) the
/// mapping holds few of them yet. Advised before it was written, each
/// first touch would have asked for a huge page, and the kernel compacts
/// memory to find one in the fault (src_rust/index/huge_pages.rs).
#[cfg(target_os = "linux")]
#[test]
fn a_big_table_asks_for_huge_pages_once_written() {
    let Ok(enabled) = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled") else {
        return;
    };
    let mut table = SlotTable::default();
    for slot in 0..1_000_000u32 {
        table.insert(uniform_hash(u64::from(slot)), slot);
    }
    let mapping = mapping_of(table.middle_address());
    let flags = mapping.get("VmFlags").expect("the mapping has VmFlags");
    assert!(flags.split_whitespace().any(|flag| flag == "hg"), "{flags}");
    if enabled.contains("[madvise]") {
        let kib = |field: &str| -> u64 {
            let value = mapping.get(field).expect("the mapping reports it");
            value
                .trim_end_matches("kB")
                .trim()
                .parse()
                .expect("a size in kB")
        };
        // khugepaged merges at most a few megabytes a wake, seconds apart.
        assert!(
            kib("AnonHugePages") * 2 < kib("Rss"),
            "{} of {} kB in huge pages",
            kib("AnonHugePages"),
            kib("Rss")
        );
    }
}

/// The fields of the `/proc/self/smaps` entry of the mapping holding `address`.
#[cfg(target_os = "linux")]
fn mapping_of(address: usize) -> BTreeMap<String, String> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps is readable");
    let mut fields = None;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((start, end)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            ) {
                if fields.is_some() {
                    break;
                }
                if (start..end).contains(&address) {
                    fields = Some(BTreeMap::new());
                }
                continue;
            }
        }
        if let (Some(fields), Some((key, value))) = (fields.as_mut(), line.split_once(':')) {
            fields.insert(key.to_string(), value.trim().to_string());
        }
    }
    fields.expect("a mapping holds the address")
}

/// Entries that overflowed a full bucket stay findable when an entry of
/// that bucket goes: a probe stops at the first bucket with room, so one
/// of them must move into it.
#[test]
fn a_removal_from_a_full_bucket_keeps_its_overflow_findable() {
    // Sixteen keys with one home (tags equal in their top bits), ten more
    // than a bucket holds, in a table of 64 homes.
    let same_home = |key: u64| (key << 32) | key;
    let mut checked = Checked::new(same_home);
    checked.table.reserve(64);
    for key in 0..16 {
        checked.insert(key);
    }
    for key in [3, 0, 9, 15, 7] {
        assert!(checked.remove(key));
        for other in 0..16 {
            assert_eq!(
                checked.find(other),
                checked.model.get(&other).copied(),
                "{other}"
            );
        }
    }
    assert_eq!(checked.table.len(), 11);
}

/// A worker names blocks by ids of its own, so it can send ids whose
/// hashes share the last home. Sixty-four of one tag fill that home and
/// the tail after it whatever the table's size: the table lengthens its
/// tail for the rest instead of doubling without end, and finds, removes
/// and remaps them.
#[test]
fn keys_crafted_to_share_the_last_home_do_not_grow_the_table() {
    let same_last_home = |key: u64| u64::from(u32::MAX) << 32 | key;
    let mut checked = Checked::new(same_last_home);
    for key in 0..300 {
        checked.insert(key);
    }
    assert!(
        checked.table.heap_bytes() < 64 << 10,
        "{} bytes",
        checked.table.heap_bytes()
    );
    for key in (0..300).step_by(3) {
        assert!(checked.remove(key));
    }
    checked.remap(5);
    for key in 0..300 {
        assert_eq!(checked.find(key), checked.model.get(&key).copied(), "{key}");
    }
    assert_eq!(checked.table.len(), checked.model.len());
}
