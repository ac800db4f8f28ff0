//! Checks that run before a batch touches the index, so a refused batch
//! leaves no trace: the shape of every event, and in strict mode that every
//! parent and removed block is held by the worker at that point of the batch.

use super::events::{BlockContent, IndexError, KvEvent};
use super::tree::PrefixTree;
use crate::ids::{EngineBlockId, WorkerId};
use rustc_hash::FxHashSet;
use std::borrow::Borrow;

impl PrefixTree {
    pub(super) fn validate_shape<E: Borrow<KvEvent>>(
        &self,
        events: &[E],
    ) -> Result<(), IndexError> {
        for (index, event) in events.iter().map(Borrow::borrow).enumerate() {
            let KvEvent::Stored {
                block_ids, content, ..
            } = event
            else {
                continue;
            };
            let malformed = |reason: String| IndexError::MalformedEvent {
                event: index,
                reason,
            };
            if block_ids.is_empty() {
                return Err(malformed("stored event has no blocks".into()));
            }
            match content {
                BlockContent::Tokens(tokens)
                    if tokens.len() != block_ids.len() * self.block_size =>
                {
                    return Err(malformed(format!(
                        "stored event has {} tokens for {} blocks; with block_size {} it needs {}",
                        tokens.len(),
                        block_ids.len(),
                        self.block_size,
                        block_ids.len() * self.block_size
                    )));
                }
                BlockContent::LocalHashes(hashes) if hashes.len() != block_ids.len() => {
                    return Err(malformed(format!(
                        "stored event has {} local hashes for {} blocks",
                        hashes.len(),
                        block_ids.len()
                    )));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Strict mode: every parent and removed block must be held by the worker
    /// at that point of the batch.
    pub(super) fn validate_known<E: Borrow<KvEvent>>(
        &self,
        worker: WorkerId,
        slot: Option<u32>,
        events: &[E],
    ) -> Result<(), IndexError> {
        let held_before = |block: EngineBlockId| {
            slot.is_some_and(|slot| {
                self.node_of_block(slot, block)
                    .and_then(|index| self.sets.get(self.arena.node(index).owners, slot))
                    .is_some_and(|held| !held.is_approximate())
            })
        };
        let mut added = FxHashSet::default();
        let mut removed = FxHashSet::default();
        let mut cleared = false;
        let known = |block: &EngineBlockId,
                     added: &FxHashSet<EngineBlockId>,
                     removed: &FxHashSet<EngineBlockId>,
                     cleared: bool| {
            added.contains(block) || (!cleared && !removed.contains(block) && held_before(*block))
        };
        let unknown = |event: usize, block: EngineBlockId| IndexError::UnknownBlock {
            event,
            worker,
            block: block.0,
        };
        for (event, kv_event) in events.iter().map(Borrow::borrow).enumerate() {
            match kv_event {
                KvEvent::Stored {
                    parent, block_ids, ..
                } => {
                    if let Some(parent) = parent {
                        if !known(parent, &added, &removed, cleared) {
                            return Err(IndexError::UnknownParent {
                                event,
                                worker,
                                block: parent.0,
                            });
                        }
                    }
                    for block in block_ids {
                        removed.remove(block);
                        added.insert(*block);
                    }
                }
                KvEvent::EndsReusable { block_ids, .. } => {
                    for block in block_ids {
                        if !known(block, &added, &removed, cleared) {
                            return Err(unknown(event, *block));
                        }
                    }
                }
                KvEvent::Removed { block_ids, .. } => {
                    for block in block_ids {
                        if !known(block, &added, &removed, cleared) {
                            return Err(unknown(event, *block));
                        }
                        added.remove(block);
                        removed.insert(*block);
                    }
                }
                KvEvent::Cleared => {
                    cleared = true;
                    added.clear();
                    removed.clear();
                }
            }
        }
        Ok(())
    }
}
