//! KV events as Python objects: `Stored`, `Removed` and `Cleared`, plus `Tier`.

use super::ints::{extract_hashes, Tokens};
use crate::hashing::{namespace_seed, BlockHasher};
use crate::ids::{EngineBlockId, LocalHash, Tier};
use crate::index::{BlockContent, KvEvent};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// Where a worker keeps a block.
#[pyclass(name = "Tier", module = "kvrouter._core", eq, eq_int, frozen, hash)]
#[derive(Copy, Clone, PartialEq, Eq, Hash)]
pub enum PyTier {
    #[pyo3(name = "DEVICE")]
    Device = 0,
    #[pyo3(name = "HOST")]
    Host = 1,
    #[pyo3(name = "DISK")]
    Disk = 2,
}

impl From<PyTier> for Tier {
    fn from(tier: PyTier) -> Tier {
        match tier {
            PyTier::Device => Tier::Device,
            PyTier::Host => Tier::Host,
            PyTier::Disk => Tier::Disk,
        }
    }
}

impl From<Tier> for PyTier {
    fn from(tier: Tier) -> PyTier {
        match tier {
            Tier::Device => PyTier::Device,
            Tier::Host => PyTier::Host,
            Tier::Disk => PyTier::Disk,
        }
    }
}

/// A `Tier` or its name ("device", "host", "disk").
pub fn extract_tier(obj: &Bound<'_, PyAny>) -> PyResult<Tier> {
    if let Ok(tier) = obj.extract::<PyTier>() {
        return Ok(tier.into());
    }
    let name: String = obj.extract().map_err(|_| {
        PyTypeError::new_err("tier must be a Tier or one of 'device', 'host', 'disk'")
    })?;
    Tier::ALL
        .into_iter()
        .find(|t| t.name() == name.to_ascii_lowercase())
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "unknown tier {name:?}; expected 'device', 'host' or 'disk'"
            ))
        })
}

fn block_ids(obj: &Bound<'_, PyAny>) -> PyResult<Vec<EngineBlockId>> {
    Ok(extract_hashes(obj)?
        .into_iter()
        .map(EngineBlockId)
        .collect())
}

/// Blocks a worker cached: consecutive blocks of one sequence after `parent`,
/// with either their tokens (`token_ids`, `block_size` per block) or their
/// router-compatible `local_hashes`.
#[pyclass(name = "Stored", module = "kvrouter._core", frozen)]
pub struct PyStored(pub KvEvent);

#[pymethods]
impl PyStored {
    #[new]
    #[pyo3(signature = (block_ids, token_ids = None, *, local_hashes = None, parent = None, tier = None, namespace = ""))]
    fn new(
        block_ids: &Bound<'_, PyAny>,
        token_ids: Option<&Bound<'_, PyAny>>,
        local_hashes: Option<&Bound<'_, PyAny>>,
        parent: Option<u64>,
        tier: Option<&Bound<'_, PyAny>>,
        namespace: &str,
    ) -> PyResult<Self> {
        let content = match (token_ids, local_hashes) {
            (Some(tokens), None) => {
                BlockContent::Tokens(Tokens::extract(tokens)?.as_slice().to_vec())
            }
            (None, Some(hashes)) => BlockContent::LocalHashes(
                extract_hashes(hashes)?.into_iter().map(LocalHash).collect(),
            ),
            _ => {
                return Err(PyValueError::new_err(
                    "Stored needs exactly one of token_ids or local_hashes",
                ))
            }
        };
        Ok(PyStored(KvEvent::Stored {
            parent: parent.map(EngineBlockId),
            block_ids: self::block_ids(block_ids)?,
            content,
            tier: tier.map(extract_tier).transpose()?.unwrap_or(Tier::Device),
            namespace_seed: namespace_seed(namespace),
        }))
    }

    #[getter]
    fn block_ids(&self) -> Vec<u64> {
        match &self.0 {
            KvEvent::Stored { block_ids, .. } => block_ids.iter().map(|b| b.0).collect(),
            _ => unreachable!("PyStored holds a Stored event"),
        }
    }

    #[getter]
    fn parent(&self) -> Option<u64> {
        match &self.0 {
            KvEvent::Stored { parent, .. } => parent.map(|p| p.0),
            _ => unreachable!("PyStored holds a Stored event"),
        }
    }

    fn __repr__(&self) -> String {
        match &self.0 {
            KvEvent::Stored {
                parent,
                block_ids,
                tier,
                ..
            } => format!(
                "Stored({} blocks, parent={:?}, tier={tier})",
                block_ids.len(),
                parent.map(|p| p.0)
            ),
            _ => unreachable!("PyStored holds a Stored event"),
        }
    }
}

/// Blocks a worker evicted from one tier.
#[pyclass(name = "Removed", module = "kvrouter._core", frozen)]
pub struct PyRemoved(pub KvEvent);

#[pymethods]
impl PyRemoved {
    #[new]
    #[pyo3(signature = (block_ids, tier = None))]
    fn new(block_ids: &Bound<'_, PyAny>, tier: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Ok(PyRemoved(KvEvent::Removed {
            block_ids: self::block_ids(block_ids)?,
            tier: tier.map(extract_tier).transpose()?.unwrap_or(Tier::Device),
        }))
    }

    #[getter]
    fn block_ids(&self) -> Vec<u64> {
        match &self.0 {
            KvEvent::Removed { block_ids, .. } => block_ids.iter().map(|b| b.0).collect(),
            _ => unreachable!("PyRemoved holds a Removed event"),
        }
    }

    fn __repr__(&self) -> String {
        match &self.0 {
            KvEvent::Removed { block_ids, tier } => {
                format!("Removed({} blocks, tier={tier})", block_ids.len())
            }
            _ => unreachable!("PyRemoved holds a Removed event"),
        }
    }
}

/// The worker dropped its whole cache.
#[pyclass(name = "Cleared", module = "kvrouter._core", frozen)]
pub struct PyCleared;

#[pymethods]
impl PyCleared {
    #[new]
    fn new() -> Self {
        PyCleared
    }

    fn __repr__(&self) -> &'static str {
        "Cleared()"
    }
}

/// The Rust events of a Python list of `Stored` / `Removed` / `Cleared`.
/// Token ids are hashed here, before the index lock is taken, so the batch
/// carries 8 bytes per block instead of a copy of its tokens.
pub fn extract_events(events: &Bound<'_, PyAny>, block_size: usize) -> PyResult<Vec<KvEvent>> {
    events
        .try_iter()?
        .enumerate()
        .map(|(index, item)| {
            let item = item?;
            if let Ok(stored) = item.cast::<PyStored>() {
                hashed(&stored.get().0, block_size)
                    .map_err(|reason| PyValueError::new_err(format!("event {index}: {reason}")))
            } else if let Ok(removed) = item.cast::<PyRemoved>() {
                Ok(removed.get().0.clone())
            } else if item.cast::<PyCleared>().is_ok() {
                Ok(KvEvent::Cleared)
            } else {
                Err(PyTypeError::new_err(format!(
                    "event {index} is a {}, not Stored, Removed or Cleared",
                    item.get_type().name()?
                )))
            }
        })
        .collect()
}

/// A stored event with its tokens replaced by their local hashes.
fn hashed(event: &KvEvent, block_size: usize) -> Result<KvEvent, String> {
    let KvEvent::Stored {
        parent,
        block_ids,
        content,
        tier,
        namespace_seed,
    } = event
    else {
        unreachable!("PyStored holds a Stored event")
    };
    if block_ids.is_empty() {
        return Err("stored event has no blocks".into());
    }
    let content = match content {
        BlockContent::Tokens(tokens) => {
            let needed = block_ids.len() * block_size;
            if tokens.len() != needed {
                return Err(format!(
                    "stored event has {} tokens for {} blocks; with block_size {block_size} it needs {needed}",
                    tokens.len(),
                    block_ids.len()
                ));
            }
            BlockContent::LocalHashes(
                BlockHasher::new(block_size, *namespace_seed).local_hashes(tokens),
            )
        }
        BlockContent::LocalHashes(hashes) => BlockContent::LocalHashes(hashes.clone()),
    };
    Ok(KvEvent::Stored {
        parent: *parent,
        block_ids: block_ids.clone(),
        content,
        tier: *tier,
        namespace_seed: *namespace_seed,
    })
}
