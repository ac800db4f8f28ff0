//! What a prefix lookup returns: per worker, how deep the request's prefix is
//! cached, split by the tier each matched block lives in.

use crate::ids::{Tier, WorkerId};

/// Matched prefix length of one worker, in blocks, by tier.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TierDepths {
    pub device: u32,
    pub host: u32,
    pub disk: u32,
}

impl TierDepths {
    pub fn total(&self) -> u32 {
        self.device + self.host + self.disk
    }

    pub fn add_many(&mut self, tier: Tier, blocks: u32) {
        match tier {
            Tier::Device => self.device += blocks,
            Tier::Host => self.host += blocks,
            Tier::Disk => self.disk += blocks,
        }
    }
}

/// The workers holding a non-empty prefix of the query, in slot order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OverlapScores {
    pub scores: Vec<(WorkerId, TierDepths)>,
}

impl OverlapScores {
    pub fn depth(&self, worker: WorkerId) -> u32 {
        self.get(worker).map_or(0, |d| d.total())
    }

    pub fn get(&self, worker: WorkerId) -> Option<TierDepths> {
        self.scores
            .iter()
            .find(|(id, _)| *id == worker)
            .map(|(_, depths)| *depths)
    }
}
