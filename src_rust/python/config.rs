//! `PolicyConfig` for Python: the core's `policy::PolicyConfig` with flat,
//! settable fields. Defaults come from the core's `Default`; nothing here
//! restates them.

use crate::policy::{Coefficients, PolicyConfig, PolicyName, Selector};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// Every setting with its Python type, for config files and flags.
const FIELDS: [(&str, &str); 23] = [
    ("policy", "str"),
    ("prefill_base_ms", "float"),
    ("prefill_ms_per_token", "float"),
    ("attention_ms_per_token2", "float"),
    ("decode_ms_per_block", "float"),
    ("host_reload_ms_per_block", "float"),
    ("disk_reload_ms_per_block", "float"),
    ("transfer_ms_per_block", "float"),
    ("max_batched_tokens", "int"),
    ("calibrate", "bool"),
    ("calibration_alpha", "float"),
    ("temperature", "float"),
    ("tie_tolerance", "float"),
    ("overload_factor", "float"),
    ("congestion_weight", "float"),
    ("pollution_weight", "float"),
    ("tail_weight", "float"),
    ("seed", "int"),
    ("local_prefill_max_tokens", "int"),
    ("prefill_saturation_ms", "float"),
    ("stale_after_s", "float"),
    ("unreported_grace_s", "float"),
    ("approximate_ttl_s", "float"),
];

/// The routing policy's settings. What each one means: docs/routing.md and
/// `src_rust/policy/config.rs`.
#[pyclass(name = "PolicyConfig", module = "kvrouter._core", eq)]
#[derive(Clone, PartialEq)]
pub struct PyPolicyConfig {
    #[pyo3(get, set)]
    policy: String,
    #[pyo3(get, set)]
    prefill_base_ms: f64,
    #[pyo3(get, set)]
    prefill_ms_per_token: f64,
    #[pyo3(get, set)]
    attention_ms_per_token2: f64,
    #[pyo3(get, set)]
    decode_ms_per_block: f64,
    #[pyo3(get, set)]
    host_reload_ms_per_block: f64,
    #[pyo3(get, set)]
    disk_reload_ms_per_block: f64,
    #[pyo3(get, set)]
    transfer_ms_per_block: f64,
    #[pyo3(get, set)]
    max_batched_tokens: u64,
    #[pyo3(get, set)]
    calibrate: bool,
    #[pyo3(get, set)]
    calibration_alpha: f64,
    #[pyo3(get, set)]
    temperature: f64,
    #[pyo3(get, set)]
    tie_tolerance: f64,
    #[pyo3(get, set)]
    overload_factor: f64,
    #[pyo3(get, set)]
    congestion_weight: f64,
    #[pyo3(get, set)]
    pollution_weight: f64,
    #[pyo3(get, set)]
    tail_weight: f64,
    #[pyo3(get, set)]
    seed: u64,
    #[pyo3(get, set)]
    local_prefill_max_tokens: u64,
    #[pyo3(get, set)]
    prefill_saturation_ms: f64,
    #[pyo3(get, set)]
    stale_after_s: f64,
    #[pyo3(get, set)]
    unreported_grace_s: f64,
    #[pyo3(get, set)]
    approximate_ttl_s: f64,
}

impl From<&PolicyConfig> for PyPolicyConfig {
    fn from(c: &PolicyConfig) -> Self {
        let k = &c.coefficients;
        PyPolicyConfig {
            policy: c.policy.name().to_owned(),
            prefill_base_ms: k.prefill_base_ms,
            prefill_ms_per_token: k.prefill_ms_per_token,
            attention_ms_per_token2: k.attention_ms_per_token2,
            decode_ms_per_block: k.decode_ms_per_block,
            host_reload_ms_per_block: k.host_reload_ms_per_block,
            disk_reload_ms_per_block: k.disk_reload_ms_per_block,
            transfer_ms_per_block: k.transfer_ms_per_block,
            max_batched_tokens: k.max_batched_tokens as u64,
            calibrate: c.calibrate,
            calibration_alpha: c.calibration_alpha,
            temperature: c.selector.temperature,
            tie_tolerance: c.selector.tie_tolerance,
            overload_factor: c.selector.overload_factor,
            congestion_weight: c.congestion_weight,
            pollution_weight: c.pollution_weight,
            tail_weight: c.tail_weight,
            seed: c.seed,
            local_prefill_max_tokens: c.local_prefill_max_tokens,
            prefill_saturation_ms: c.prefill_saturation_ms,
            stale_after_s: c.stale_after_ms as f64 / 1000.0,
            unreported_grace_s: c.unreported_grace_ms as f64 / 1000.0,
            approximate_ttl_s: c.approximate_ttl_ms as f64 / 1000.0,
        }
    }
}

fn seconds_to_ms(name: &str, seconds: f64) -> PyResult<u64> {
    if !(seconds >= 0.0 && seconds.is_finite()) {
        return Err(PyValueError::new_err(format!(
            "PolicyConfig.{name} must be a finite number >= 0, got {seconds}"
        )));
    }
    Ok((seconds * 1000.0).round() as u64)
}

impl PyPolicyConfig {
    /// The core's config; ValueError names the first setting out of range.
    pub(crate) fn to_core(&self) -> PyResult<PolicyConfig> {
        let config = PolicyConfig {
            policy: PolicyName::parse(&self.policy).map_err(PyValueError::new_err)?,
            coefficients: Coefficients {
                prefill_base_ms: self.prefill_base_ms,
                prefill_ms_per_token: self.prefill_ms_per_token,
                attention_ms_per_token2: self.attention_ms_per_token2,
                decode_ms_per_block: self.decode_ms_per_block,
                host_reload_ms_per_block: self.host_reload_ms_per_block,
                disk_reload_ms_per_block: self.disk_reload_ms_per_block,
                transfer_ms_per_block: self.transfer_ms_per_block,
                max_batched_tokens: self.max_batched_tokens as f64,
            },
            selector: Selector {
                temperature: self.temperature,
                tie_tolerance: self.tie_tolerance,
                overload_factor: self.overload_factor,
            },
            calibrate: self.calibrate,
            calibration_alpha: self.calibration_alpha,
            seed: self.seed,
            local_prefill_max_tokens: self.local_prefill_max_tokens,
            prefill_saturation_ms: self.prefill_saturation_ms,
            stale_after_ms: seconds_to_ms("stale_after_s", self.stale_after_s)?,
            unreported_grace_ms: seconds_to_ms("unreported_grace_s", self.unreported_grace_s)?,
            congestion_weight: self.congestion_weight,
            pollution_weight: self.pollution_weight,
            tail_weight: self.tail_weight,
            approximate_ttl_ms: seconds_to_ms("approximate_ttl_s", self.approximate_ttl_s)?,
        };
        config.validate().map_err(PyValueError::new_err)?;
        Ok(config)
    }

    fn with(&self, py: Python<'_>, settings: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let updated = Bound::new(py, self.clone())?;
        if let Some(settings) = settings {
            for (name, value) in settings.iter() {
                let name: String = name.extract()?;
                if !FIELDS.iter().any(|(field, _)| *field == name) {
                    return Err(PyTypeError::new_err(format!(
                        "PolicyConfig has no setting {name:?}"
                    )));
                }
                updated.setattr(name.as_str(), value)?;
            }
        }
        let config = updated.borrow().clone();
        config.to_core()?;
        Ok(config)
    }
}

#[pymethods]
impl PyPolicyConfig {
    /// Any setting by keyword; the rest keep their defaults. ValueError for
    /// a setting out of range, TypeError for an unknown one.
    #[new]
    #[pyo3(signature = (**settings))]
    fn new(py: Python<'_>, settings: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        PyPolicyConfig::from(&PolicyConfig::default()).with(py, settings)
    }

    /// A copy with some settings changed.
    #[pyo3(signature = (**settings))]
    fn replace(&self, py: Python<'_>, settings: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        self.with(py, settings)
    }

    /// Raises ValueError naming the first setting out of range.
    fn validate(&self) -> PyResult<()> {
        self.to_core().map(|_| ())
    }

    /// Every setting's name and Python type name ("str", "float", "int", "bool").
    #[staticmethod]
    fn fields() -> Vec<(&'static str, &'static str)> {
        FIELDS.to_vec()
    }

    /// The names the `policy` setting takes.
    #[staticmethod]
    fn policies() -> Vec<&'static str> {
        PolicyName::ALL.iter().map(|p| p.name()).collect()
    }

    fn to_dict<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(slf.py());
        for (name, _) in Self::fields() {
            dict.set_item(name, slf.getattr(name)?)?;
        }
        Ok(dict)
    }

    fn __copy__(&self) -> Self {
        self.clone()
    }

    fn __deepcopy__(&self, _memo: &Bound<'_, PyAny>) -> Self {
        self.clone()
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let kwargs = Self::to_dict(slf)?;
        let build = py
            .import("functools")?
            .getattr("partial")?
            .call((slf.get_type(),), Some(&kwargs))?;
        PyTuple::new(py, [build.into_any(), PyTuple::empty(py).into_any()])
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let parts: Vec<String> = Self::fields()
            .into_iter()
            .map(|(name, _)| Ok(format!("{name}={}", slf.getattr(name)?.repr()?)))
            .collect::<PyResult<_>>()?;
        Ok(format!("PolicyConfig({})", parts.join(", ")))
    }
}
