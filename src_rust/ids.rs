//! Newtypes for the identifiers that flow through the index, so a worker id can
//! never be passed where a block hash is expected.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A worker (one engine instance, or one data-parallel rank of it).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkerId(pub u64);

/// xxh3-64 of one full block's tokens, seeded by the namespace.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LocalHash(pub u64);

/// The hash of a whole prefix: block i's local hash chained onto block i-1's
/// sequence hash. Identifies a node of the prefix index.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SeqHash(pub u64);

/// An engine's own, opaque id for a cached block.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EngineBlockId(pub u64);

/// Where a worker keeps a cached block. Lower is faster to use.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Tier {
    Device = 0,
    Host = 1,
    Disk = 2,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::Device, Tier::Host, Tier::Disk];

    pub fn from_index(index: u8) -> Option<Tier> {
        Tier::ALL.get(index as usize).copied()
    }

    pub fn name(self) -> &'static str {
        match self {
            Tier::Device => "device",
            Tier::Host => "host",
            Tier::Disk => "disk",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "worker {}", self.0)
    }
}
