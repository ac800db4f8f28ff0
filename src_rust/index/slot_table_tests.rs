//! Property tests: the slot table against a plain map, with hashes drawn
//! from a few values so that runs, equal tags and shifts are common.

use super::slot_table::SlotTable;
use proptest::prelude::*;
use std::collections::BTreeMap;

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
