//! Property tests: the slot table against a plain map, with hashes drawn
//! from a few values so that runs, equal tags and shifts are common, and
//! with uniform hashes over enough keys that the table doubles several
//! times between removals and remaps.

use super::slot_table::SlotTable;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};

#[derive(Clone, Debug)]
enum Op {
    Insert(u64),
    Remove(u64),
    /// Drops every key whose slot is a multiple of the value, renumbering the rest.
    Remap(u32),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u64..300;
    prop_oneof![
        6 => key.clone().prop_map(Op::Insert),
        3 => key.prop_map(Op::Remove),
        1 => (2u32..5).prop_map(Op::Remap),
    ]
}

/// Few distinct tags, spread over the whole tag range, so homes collide.
fn hash_of(key: u64) -> u64 {
    (key % 23).wrapping_mul(0x0B00_0000_0000_0000) | key
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn slot_table_matches_a_map(ops in proptest::collection::vec(op(), 1..400)) {
        let mut table = SlotTable::default();
        // slot -> key, the caller's side of the table.
        let mut keys: Vec<Option<u64>> = Vec::new();
        let mut model: BTreeMap<u64, u32> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Insert(key) => {
                    model.entry(key).or_insert_with(|| {
                        let slot = keys.len() as u32;
                        keys.push(Some(key));
                        table.insert(hash_of(key), slot);
                        slot
                    });
                }
                Op::Remove(key) => {
                    let slot = model.remove(&key);
                    let removed = slot.is_some_and(|slot| table.remove(hash_of(key), slot));
                    prop_assert_eq!(removed, slot.is_some());
                    if let Some(slot) = slot {
                        keys[slot as usize] = None;
                    }
                }
                Op::Remap(every) => {
                    let mut next = 0u32;
                    let renumber: Vec<Option<u32>> = (0..keys.len() as u32)
                        .map(|slot| {
                            (keys[slot as usize].is_some() && slot % every != 0).then(|| {
                                next += 1;
                                next - 1
                            })
                        })
                        .collect();
                    table.remap(|slot| renumber[slot as usize]);
                    keys = (0..keys.len())
                        .filter(|&slot| renumber[slot].is_some())
                        .map(|slot| keys[slot])
                        .collect();
                    model.retain(|_, slot| match renumber[*slot as usize] {
                        Some(new) => {
                            *slot = new;
                            true
                        }
                        None => false,
                    });
                }
            }
            prop_assert_eq!(table.len(), model.len());
            for key in 0..300u64 {
                let found = table.find(hash_of(key), |slot| keys[slot as usize] == Some(key));
                prop_assert_eq!(found, model.get(&key).copied(), "key {}", key);
            }
        }
    }
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
}

fn range_op() -> impl Strategy<Value = RangeOp> {
    let start = 0u64..12_000;
    prop_oneof![
        8 => (start.clone(), 1u64..200).prop_map(|(s, n)| RangeOp::Insert(s, n)),
        3 => (start, 1u64..200).prop_map(|(s, n)| RangeOp::Remove(s, n)),
        1 => (2u32..6).prop_map(RangeOp::Remap),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Thousands of keys, so that the table doubles from 16 homes to
    /// thousands, and remaps shrink it again.
    #[test]
    fn slot_table_matches_a_map_across_growth(ops in proptest::collection::vec(range_op(), 1..120)) {
        let mut table = SlotTable::default();
        let mut keys: Vec<Option<u64>> = Vec::new();
        let mut model: HashMap<u64, u32> = HashMap::new();
        let find = |table: &SlotTable, keys: &[Option<u64>], key: u64| {
            table.find(uniform_hash(key), |slot| keys[slot as usize] == Some(key))
        };
        for op in ops {
            match op {
                RangeOp::Insert(start, count) => {
                    for key in start..start + count {
                        prop_assert_eq!(find(&table, &keys, key), model.get(&key).copied());
                        if let std::collections::hash_map::Entry::Vacant(e) = model.entry(key) {
                            let slot = keys.len() as u32;
                            keys.push(Some(key));
                            table.insert(uniform_hash(key), slot);
                            e.insert(slot);
                        }
                    }
                }
                RangeOp::Remove(start, count) => {
                    for key in start..start + count {
                        let slot = model.remove(&key);
                        let removed = slot.is_some_and(|slot| table.remove(uniform_hash(key), slot));
                        prop_assert_eq!(removed, slot.is_some());
                        if let Some(slot) = slot {
                            keys[slot as usize] = None;
                        }
                    }
                }
                RangeOp::Remap(every) => {
                    let mut next = 0u32;
                    let renumber: Vec<Option<u32>> = (0..keys.len() as u32)
                        .map(|slot| {
                            (keys[slot as usize].is_some() && slot % every != 0).then(|| {
                                next += 1;
                                next - 1
                            })
                        })
                        .collect();
                    table.remap(|slot| renumber[slot as usize]);
                    keys = (0..keys.len())
                        .filter(|&slot| renumber[slot].is_some())
                        .map(|slot| keys[slot])
                        .collect();
                    model.retain(|_, slot| match renumber[*slot as usize] {
                        Some(new) => {
                            *slot = new;
                            true
                        }
                        None => false,
                    });
                }
            }
            prop_assert_eq!(table.len(), model.len());
        }
        for key in 0..12_200u64 {
            prop_assert_eq!(find(&table, &keys, key), model.get(&key).copied(), "key {}", key);
        }
    }
}
