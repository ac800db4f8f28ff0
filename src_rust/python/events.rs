//! KV events as Python objects: `Stored`, `Removed`, `EndsReusable` and
//! `Cleared`, plus `Tier`.

use super::ints::{extract_hashes, Tokens};
use crate::ids::{EngineBlockId, LocalHash, Tier};
use crate::index::{block_size_mismatch, KvEvent, StoredContent};
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
/// with either their tokens (`token_ids`, the same number per block) or their
/// router-compatible `local_hashes`. Tokens are hashed here, once, and not
/// kept; applying the event checks their block size against the index's.
#[pyclass(name = "Stored", module = "kvrouter._core", frozen)]
pub struct PyStored {
    /// Always carries local hashes.
    event: KvEvent,
    tokens_per_block: Option<usize>,
}

#[pymethods]
impl PyStored {
    #[new]
    #[pyo3(signature = (block_ids, token_ids = None, *, local_hashes = None, parent = None, tier = None, namespace = ""))]
    fn new(
        py: Python<'_>,
        block_ids: &Bound<'_, PyAny>,
        token_ids: Option<&Bound<'_, PyAny>>,
        local_hashes: Option<&Bound<'_, PyAny>>,
        parent: Option<u64>,
        tier: Option<&Bound<'_, PyAny>>,
        namespace: &str,
    ) -> PyResult<Self> {
        let block_ids = self::block_ids(block_ids)?;
        let tier = tier.map(extract_tier).transpose()?.unwrap_or(Tier::Device);
        let tokens = token_ids.map(Tokens::extract).transpose()?;
        let content = match (&tokens, local_hashes) {
            (Some(tokens), None) => StoredContent::Tokens(tokens.as_slice()),
            (None, Some(hashes)) => StoredContent::LocalHashes(
                extract_hashes(hashes)?.into_iter().map(LocalHash).collect(),
            ),
            _ => {
                return Err(PyValueError::new_err(
                    "Stored needs exactly one of token_ids or local_hashes",
                ))
            }
        };
        let parent = parent.map(EngineBlockId);
        // Hashing the tokens is the work here.
        let stored = py.detach(|| KvEvent::stored(parent, block_ids, content, tier, namespace));
        let (event, tokens_per_block) = stored.map_err(PyValueError::new_err)?;
        Ok(PyStored {
            event,
            tokens_per_block,
        })
    }

    #[getter]
    fn block_ids(&self) -> Vec<u64> {
        match &self.event {
            KvEvent::Stored { block_ids, .. } => block_ids.iter().map(|b| b.0).collect(),
            _ => unreachable!("PyStored holds a Stored event"),
        }
    }

    #[getter]
    fn parent(&self) -> Option<u64> {
        match &self.event {
            KvEvent::Stored { parent, .. } => parent.map(|p| p.0),
            _ => unreachable!("PyStored holds a Stored event"),
        }
    }

    fn __repr__(&self) -> String {
        match &self.event {
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

/// Blocks the worker holds, marked as ends a reused prefix may stop at
/// (`reusable`) or not.
#[pyclass(name = "EndsReusable", module = "kvrouter._core", frozen)]
pub struct PyEndsReusable(pub KvEvent);

#[pymethods]
impl PyEndsReusable {
    #[new]
    fn new(block_ids: &Bound<'_, PyAny>, reusable: bool) -> PyResult<Self> {
        Ok(PyEndsReusable(KvEvent::EndsReusable {
            block_ids: self::block_ids(block_ids)?,
            reusable,
        }))
    }

    #[getter]
    fn block_ids(&self) -> Vec<u64> {
        match &self.0 {
            KvEvent::EndsReusable { block_ids, .. } => block_ids.iter().map(|b| b.0).collect(),
            _ => unreachable!("PyEndsReusable holds an EndsReusable event"),
        }
    }

    fn __repr__(&self) -> String {
        match &self.0 {
            KvEvent::EndsReusable {
                block_ids,
                reusable,
            } => format!(
                "EndsReusable({} blocks, reusable={reusable})",
                block_ids.len()
            ),
            _ => unreachable!("PyEndsReusable holds an EndsReusable event"),
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

static CLEARED: KvEvent = KvEvent::Cleared;

/// A batch's event objects, kept alive so the index can read their events in
/// place, with the GIL released, instead of copying them.
pub struct EventObjects<'py>(Vec<Bound<'py, PyAny>>);

impl<'py> EventObjects<'py> {
    pub fn collect(events: &Bound<'py, PyAny>) -> PyResult<Self> {
        Ok(EventObjects(events.try_iter()?.collect::<PyResult<_>>()?))
    }

    /// The events, checked to be events and to match the index's block size.
    pub fn events(&self, block_size: usize) -> PyResult<Vec<&KvEvent>> {
        self.0
            .iter()
            .enumerate()
            .map(|(index, item)| {
                if let Ok(stored) = item.cast::<PyStored>() {
                    let stored = stored.get();
                    match stored.tokens_per_block {
                        Some(size) if size != block_size => Err(PyValueError::new_err(
                            block_size_mismatch(index, size, block_size),
                        )),
                        _ => Ok(&stored.event),
                    }
                } else if let Ok(removed) = item.cast::<PyRemoved>() {
                    Ok(&removed.get().0)
                } else if let Ok(ends) = item.cast::<PyEndsReusable>() {
                    Ok(&ends.get().0)
                } else if item.cast::<PyCleared>().is_ok() {
                    Ok(&CLEARED)
                } else {
                    Err(PyTypeError::new_err(format!(
                        "event {index} is a {}, not Stored, Removed, EndsReusable or Cleared",
                        item.get_type().name()?
                    )))
                }
            })
            .collect()
    }
}
