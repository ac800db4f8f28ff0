//! `Router` for Python: the core's `routing::Router` over a `PrefixIndex`,
//! with its two ways in: `route` (a prompt in, a `Decision` out) and
//! `route_wire` (`RouteRequest` bytes in, `RouteResponse` bytes out). Both
//! release the GIL and decide through the same core call; this file only
//! converts.

use super::config::PyPolicyConfig;
use super::decision::{PyBooking, PyDecision};
use super::index::PyPrefixIndex;
use super::ints::{extract_hashes, Tokens};
use crate::ids::{SeqHash, WorkerId};
use crate::policy::{Load, PolicyConfig, Role, RouteError, Serves, Timing};
use crate::routing::{self, BookingChange, Histogram, Prompt, Refusal, RouterOptions};
use crate::wire::{self, Directory, Limits};
use parking_lot::{Mutex, RwLock};
use prost::Message;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyKeyError, PyLookupError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::borrow::Cow;
use std::time::Instant;

create_exception!(
    kvrouter._core,
    NoWorkerAvailable,
    PyRuntimeError,
    "No healthy worker can take the request (none registered, all unhealthy, or none with room for the prompt)."
);

create_exception!(
    kvrouter._core,
    UnknownModel,
    PyLookupError,
    "The request names a model that no registered worker serves."
);

create_exception!(
    kvrouter._core,
    RouteRefused,
    PyException,
    "A routing request the router turns down. args: (code, message, request_id), the code as grpc.StatusCode names it."
);

fn to_pyerr(error: RouteError) -> PyErr {
    let message = error.to_string();
    match error {
        RouteError::DuplicateRequest(_) => PyValueError::new_err(message),
        RouteError::UnknownWorker(_) => PyKeyError::new_err(message),
        RouteError::NoWorker { .. } => NoWorkerAvailable::new_err(message),
        RouteError::UnknownModel(_) | RouteError::AmbiguousAdapter { .. } => {
            UnknownModel::new_err(message)
        }
    }
}

/// Bucket counts as Prometheus reads them: `counts` has one more entry
/// than `bounds`, for +Inf.
#[pyclass(name = "Histogram", module = "kvrouter._core", frozen, get_all)]
#[derive(Clone)]
pub struct PyHistogram {
    bounds: Vec<f64>,
    counts: Vec<u64>,
    sum: f64,
}

impl From<&Histogram> for PyHistogram {
    fn from(h: &Histogram) -> Self {
        PyHistogram {
            bounds: h.bounds.clone(),
            counts: h.counts.clone(),
            sum: h.sum,
        }
    }
}

/// A router's figures so far, for a metrics scrape.
#[pyclass(name = "RouteStats", module = "kvrouter._core", frozen, get_all)]
pub struct PyRouteStats {
    /// (worker, "decode" | "prefill", decisions), sorted.
    decisions: Vec<(u64, &'static str, u64)>,
    /// (status code, refusals), sorted.
    errors: Vec<(&'static str, u64)>,
    /// Seconds to decide one request.
    latency: PyHistogram,
    /// Cached share of the prompt's blocks on the decode worker.
    overlap: PyHistogram,
    /// Bookings retired because their worker's report no longer counted them.
    retired_unreported: u64,
    /// Decisions a session's last worker won among tied candidates.
    by_affinity: u64,
}

#[pyclass(name = "Router", module = "kvrouter._core", frozen)]
pub struct PyRouter {
    router: routing::Router,
    index: Py<PyPrefixIndex>,
    clock: Option<Py<PyAny>>,
    started: Instant,
    limits: Limits,
    directory: RwLock<Directory>,
    /// Held while the index is asked to be sized, so that the last ask
    /// reads the last registry; None for a router that leaves its index to
    /// grow.
    sizing: Option<Mutex<()>>,
}

impl PyRouter {
    fn now_ms(&self, py: Python<'_>) -> PyResult<u64> {
        let seconds = match &self.clock {
            Some(clock) => clock.bind(py).call0()?.extract::<f64>()?,
            None => self.started.elapsed().as_secs_f64(),
        };
        Ok((seconds * 1000.0).max(0.0) as u64)
    }

    fn wire_route(
        &self,
        bytes: &[u8],
        now_ms: u64,
    ) -> Result<(Vec<u8>, String), (String, Refusal)> {
        let request = wire::parse(bytes, &self.limits).inspect_err(|(_, refusal)| {
            self.router.refused(refusal.code);
        })?;
        let index = &self.index.get().0;
        let prompt = Prompt::Tokens {
            tokens: &request.tokens,
            namespace: &request.namespace,
        };
        let routed = self
            .router
            .route(
                index,
                &request.request_id,
                &request.model,
                &request.session,
                prompt,
                now_ms,
            )
            .map_err(|(id, e)| (id, Refusal::from(e)))?;
        let response = self
            .directory
            .read()
            .response(
                &routed.request_id,
                &routed.decision,
                routed.num_blocks,
                request.explain,
            )
            .encode_to_vec();
        Ok((response, routed.request_id))
    }

    /// Has the index sized for what the registered workers can hold
    /// together, so that it does not double its tables while applying
    /// their events (src_rust/index/README.md); a smaller fleet shrinks
    /// them. The index's sizing thread does it: a registration does not
    /// wait for tables of up to 128 MiB to be made.
    fn size_index(&self) {
        let Some(sizing) = &self.sizing else {
            return;
        };
        let _sizing = sizing.lock();
        let fleet_blocks = self.router.with_pool(|pool| pool.capacity_blocks());
        self.index
            .get()
            .0
            .reserve_in_background(usize::try_from(fleet_blocks).unwrap_or(usize::MAX));
    }

    fn worker_call<T>(
        &self,
        f: impl FnOnce(&mut crate::policy::Pool) -> Result<T, RouteError>,
    ) -> PyResult<T> {
        self.router.with_pool(f).map_err(to_pyerr)
    }
}

fn parse_role(role: &str) -> PyResult<Role> {
    Role::parse(role).ok_or_else(|| {
        PyValueError::new_err(format!(
            "role must be prefill, decode or both, got {role:?}"
        ))
    })
}

#[pymethods]
impl PyRouter {
    /// Routes over `index` with `config` (defaults when None). `clock`
    /// returns seconds and drives stale-booking expiry (the replay passes
    /// virtual time); by default, time since construction. The `max_*`
    /// limits apply to `route_wire` requests. With `size_index` the index's
    /// tables are sized for the registered workers' capacity.
    #[new]
    #[pyo3(signature = (
        index, config = None, *, clock = None, id_prefix = "r", log_decisions = false,
        share_bookings = false, size_index = true, max_prompt_tokens = None,
        max_namespace_chars = None, max_model_chars = None, max_request_id_chars = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        index: Py<PyPrefixIndex>,
        config: Option<&PyPolicyConfig>,
        clock: Option<Py<PyAny>>,
        id_prefix: &str,
        log_decisions: bool,
        share_bookings: bool,
        size_index: bool,
        max_prompt_tokens: Option<usize>,
        max_namespace_chars: Option<usize>,
        max_model_chars: Option<usize>,
        max_request_id_chars: Option<usize>,
    ) -> PyResult<Self> {
        let config = match config {
            Some(config) => config.to_core()?,
            None => PolicyConfig::default(),
        };
        let block_size = index.get().0.block_size() as u64;
        let options = RouterOptions {
            id_prefix: id_prefix.to_owned(),
            log_decisions,
            share_bookings,
            ..RouterOptions::default()
        };
        let router =
            routing::Router::new(block_size, config, options).map_err(PyValueError::new_err)?;
        Ok(PyRouter {
            router,
            index,
            clock,
            started: Instant::now(),
            limits: Limits {
                max_prompt_tokens: max_prompt_tokens.unwrap_or(usize::MAX),
                max_namespace_chars: max_namespace_chars.unwrap_or(usize::MAX),
                max_model_chars: max_model_chars.unwrap_or(usize::MAX),
                max_request_id_chars: max_request_id_chars.unwrap_or(usize::MAX),
            },
            directory: RwLock::new(Directory::default()),
            sizing: size_index.then(|| Mutex::new(())),
        })
    }

    /// The index this router looks prompts up in.
    #[getter]
    fn index(&self, py: Python<'_>) -> Py<PyPrefixIndex> {
        self.index.clone_ref(py)
    }

    /// A copy of the settings in force.
    #[getter]
    fn config(&self) -> PyPolicyConfig {
        PyPolicyConfig::from(&self.router.config())
    }

    #[getter]
    fn block_size(&self) -> u64 {
        self.router.block_size()
    }

    /// False when the policy never looks at the index.
    #[getter]
    fn uses_index(&self) -> bool {
        self.router.uses_index()
    }

    // -- the registry

    /// Adds or updates a worker; `address` is what responses name. It is
    /// routed requests for `model` (empty: requests that name none) and for
    /// `model:adapter` for each of `adapters`. The index is sized for all
    /// registered workers' `capacity_blocks`, in the background
    /// (`PrefixIndex.wait_sized` waits for it).
    #[pyo3(signature = (
        worker_id, role, capacity_blocks, address = String::new(), *, model = String::new(),
        adapters = Vec::new()
    ))]
    #[allow(clippy::too_many_arguments)]
    fn upsert_worker(
        &self,
        worker_id: u64,
        role: &str,
        capacity_blocks: u64,
        address: String,
        model: String,
        adapters: Vec<String>,
    ) -> PyResult<()> {
        let parsed = parse_role(role)?;
        if capacity_blocks == 0 {
            return Err(PyValueError::new_err("capacity_blocks must be positive"));
        }
        let serves = Serves { model, adapters };
        self.router.with_pool(|pool| {
            pool.upsert_worker(WorkerId(worker_id), parsed, capacity_blocks, &serves)
        });
        self.size_index();
        self.directory
            .write()
            .set(WorkerId(worker_id), role.to_owned(), address);
        Ok(())
    }

    /// Forgets the worker; returns the ids of the requests booked on it.
    fn remove_worker(&self, worker_id: u64) -> PyResult<Vec<String>> {
        self.directory.write().remove(WorkerId(worker_id));
        let released = self.worker_call(|pool| pool.remove_worker(WorkerId(worker_id)))?;
        self.size_index();
        Ok(released)
    }

    fn set_healthy(&self, worker_id: u64, healthy: bool) -> PyResult<()> {
        self.worker_call(|pool| pool.set_healthy(WorkerId(worker_id), healthy))
    }

    /// The worker's own load; returns how many bookings it retired (ones
    /// the worker no longer counts, whose finish report never came).
    fn report_load(
        &self,
        py: Python<'_>,
        worker_id: u64,
        queued_prefill_tokens: u64,
        active_decode_blocks: u64,
        active_requests: u64,
    ) -> PyResult<usize> {
        let load = Load {
            queued_prefill_tokens,
            active_decode_blocks,
            active_requests,
            ..Load::default()
        };
        let now_ms = self.now_ms(py)?;
        self.router
            .report_load(WorkerId(worker_id), load, now_ms)
            .map_err(to_pyerr)
    }

    // -- calibration: timings the workers measured

    fn report_prefill_timing(&self, new_tokens: f64, cached_tokens: f64, duration_ms: f64) {
        self.router.observe(Timing::Prefill {
            new_tokens,
            cached_tokens,
            ms: duration_ms,
        });
    }

    fn report_decode_step(&self, active_blocks: f64, duration_ms: f64) {
        self.router.observe(Timing::DecodeStep {
            active_blocks,
            ms: duration_ms,
        });
    }

    fn report_transfer(&self, blocks: f64, duration_ms: f64) {
        self.router.observe(Timing::Transfer {
            blocks,
            ms: duration_ms,
        });
    }

    /// The cost coefficients in use (after calibration).
    fn coefficients<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.router.coefficients();
        let dict = PyDict::new(py);
        dict.set_item("prefill_base_ms", c.prefill_base_ms)?;
        dict.set_item("prefill_ms_per_token", c.prefill_ms_per_token)?;
        dict.set_item("attention_ms_per_token2", c.attention_ms_per_token2)?;
        dict.set_item("decode_ms_per_block", c.decode_ms_per_block)?;
        dict.set_item("host_reload_ms_per_block", c.host_reload_ms_per_block)?;
        dict.set_item("disk_reload_ms_per_block", c.disk_reload_ms_per_block)?;
        dict.set_item("transfer_ms_per_block", c.transfer_ms_per_block)?;
        dict.set_item("max_batched_tokens", c.max_batched_tokens)?;
        Ok(dict)
    }

    /// (queued prefill tokens, active decode blocks, active requests) as scored.
    fn load(&self, worker_id: u64) -> PyResult<(u64, u64, u64)> {
        let load = self
            .router
            .load(WorkerId(worker_id))
            .ok_or_else(|| to_pyerr(RouteError::UnknownWorker(worker_id)))?;
        Ok((
            load.queued_prefill_tokens,
            load.active_decode_blocks,
            load.active_requests,
        ))
    }

    /// Predicted ms of prefill queued on the least loaded healthy worker of
    /// `model`; None when none is healthy. Raises UnknownModel.
    #[pyo3(signature = (model = ""))]
    fn backlog_ms(&self, model: &str) -> PyResult<Option<f64>> {
        self.router.backlog_ms(model).map_err(to_pyerr)
    }

    // -- routing

    /// Picks the workers for a request among those of `model` and books
    /// its load on them, with the GIL released. The prompt is `tokens`
    /// (hashed here, in the model's namespace salted by `namespace`) or its
    /// block `hashes` (with `num_tokens`). An empty `request_id` gets one
    /// made here. A `session` id sends it, among equally good workers, where
    /// the session's last request went. Raises UnknownModel,
    /// NoWorkerAvailable, or ValueError for a request id in flight or a
    /// session id that is too long or not printable.
    #[pyo3(signature = (
        request_id, tokens = None, namespace = "", *, model = "", hashes = None, num_tokens = None,
        session = ""
    ))]
    #[allow(clippy::too_many_arguments)]
    fn route(
        &self,
        py: Python<'_>,
        request_id: &str,
        tokens: Option<&Bound<'_, PyAny>>,
        namespace: &str,
        model: &str,
        hashes: Option<&Bound<'_, PyAny>>,
        num_tokens: Option<u64>,
        session: &str,
    ) -> PyResult<PyDecision> {
        wire::check_session(session).map_err(PyValueError::new_err)?;
        let now_ms = self.now_ms(py)?;
        let index = &self.index.get().0;
        let routed = match (tokens, hashes) {
            (Some(tokens), None) => {
                let tokens = Tokens::extract(tokens)?;
                py.detach(|| {
                    let prompt = Prompt::Tokens {
                        tokens: tokens.as_slice(),
                        namespace,
                    };
                    self.router
                        .route(index, request_id, model, session, prompt, now_ms)
                })
            }
            (None, Some(hashes)) => {
                let hashes: Vec<SeqHash> =
                    extract_hashes(hashes)?.into_iter().map(SeqHash).collect();
                py.detach(|| {
                    let prompt = Prompt::Hashes {
                        hashes: &hashes,
                        num_tokens,
                    };
                    self.router
                        .route(index, request_id, model, session, prompt, now_ms)
                })
            }
            _ => {
                return Err(PyValueError::new_err(
                    "route needs exactly one of tokens or hashes",
                ))
            }
        };
        routed
            .map(PyDecision::new)
            .map_err(|(_, error)| to_pyerr(error))
    }

    /// Routes one serialized `RouteRequest` and books it: returns the
    /// serialized `RouteResponse` and the request id. Raises RouteRefused
    /// for a request it turns down.
    fn route_wire<'py>(
        &self,
        py: Python<'py>,
        request: &[u8],
    ) -> PyResult<(Bound<'py, PyBytes>, String)> {
        let now_ms = self.now_ms(py)?;
        match py.detach(|| self.wire_route(request, now_ms)) {
            Ok((response, request_id)) => Ok((PyBytes::new(py, &response), request_id)),
            Err((request_id, refusal)) => Err(RouteRefused::new_err((
                refusal.code.name(),
                refusal.message,
                request_id,
            ))),
        }
    }

    /// The prefill is done; False when the request is unknown or its
    /// prefill was already reported.
    fn prefill_done(&self, request_id: &str) -> bool {
        self.router.prefill_done(request_id)
    }

    /// Frees the request's load; False when it was not booked.
    fn finished(&self, request_id: &str) -> bool {
        self.router.release(request_id)
    }

    /// Frees the request's load; False when it was not booked.
    fn cancelled(&self, request_id: &str) -> bool {
        self.router.release(request_id)
    }

    /// The name a request for `model` routes under: `model:adapter` when
    /// it names an adapter by itself and exactly one model has that
    /// adapter, else `model` as it is. UnknownModel, naming them, when
    /// several models have that adapter.
    fn canonical_model(&self, model: &str) -> PyResult<String> {
        self.router
            .canonical_model(model)
            .map(Cow::into_owned)
            .map_err(to_pyerr)
    }

    /// Every model name workers serve (`model`, `model:adapter`; "" for
    /// workers that name none; an adapter's own name where exactly one
    /// model has it) with how many of its workers are routable now
    /// (healthy and decode-capable: a prefill worker alone answers no
    /// request).
    fn models(&self) -> Vec<(String, usize)> {
        self.router.models()
    }

    /// Requests booked and not yet finished.
    fn __len__(&self) -> usize {
        self.router.booked()
    }

    // -- what the router keeps of its decisions

    fn stats(&self) -> PyRouteStats {
        let stats = self.router.stats();
        let mut decisions: Vec<_> = stats
            .decisions
            .iter()
            .map(|(&(worker, role), &count)| (worker.0, role.name(), count))
            .collect();
        decisions.sort_unstable();
        let mut errors: Vec<_> = stats.errors.iter().map(|(&c, &n)| (c, n)).collect();
        errors.sort_unstable();
        PyRouteStats {
            decisions,
            errors,
            latency: PyHistogram::from(&stats.latency),
            overlap: PyHistogram::from(&stats.overlap),
            retired_unreported: stats.retired_unreported,
            by_affinity: stats.by_affinity,
        }
    }

    /// The decision-log lines (JSON, each ending in a newline) for the
    /// decisions made since the last call; empty unless `log_decisions`.
    fn take_decision_lines(&self, py: Python<'_>) -> String {
        let records = self.router.take_records();
        py.detach(|| routing::json_lines(&records))
    }

    // -- bookings shared between router replicas

    /// This router's booking changes since the last call, oldest first, as
    /// ("routed", request id, booking), ("prefill_done", request id, None)
    /// or ("released", request id, None); empty unless `share_bookings`.
    fn take_booking_changes(&self) -> Vec<(&'static str, String, Option<PyBooking>)> {
        self.router
            .take_booking_changes()
            .into_iter()
            .map(|change| match change {
                BookingChange::Routed {
                    request_id,
                    booking,
                } => ("routed", request_id, Some(PyBooking::from(&booking))),
                BookingChange::PrefillDone { request_id } => ("prefill_done", request_id, None),
                BookingChange::Released { request_id } => ("released", request_id, None),
            })
            .collect()
    }

    /// This router's bookings now, by request id.
    fn own_bookings(&self) -> Vec<(String, PyBooking)> {
        self.router
            .own_bookings()
            .iter()
            .map(|(id, b)| (id.clone(), PyBooking::from(b)))
            .collect()
    }

    /// A peer replica booked a request; its load counts here too.
    fn book_remote(&self, replica: &str, request_id: String, booking: &PyBooking) {
        self.router.with_pool(|pool| {
            pool.book_mut()
                .charge_remote(replica, request_id, booking.to_core(0))
        });
    }

    /// False when the peer's request is not booked here.
    fn remote_prefill_done(&self, replica: &str, request_id: &str) -> bool {
        self.router
            .with_pool(|pool| pool.book_mut().prefill_done_remote(replica, request_id))
    }

    /// False when the peer's request is not booked here.
    fn release_remote(&self, replica: &str, request_id: &str) -> bool {
        self.router
            .with_pool(|pool| pool.book_mut().release_remote(replica, request_id))
    }

    /// A peer's whole book, replacing what was known of it.
    fn replace_remote(&self, replica: &str, bookings: Vec<(String, PyRef<'_, PyBooking>)>) {
        let bookings = bookings
            .into_iter()
            .map(|(id, b)| (id, b.to_core(0)))
            .collect();
        self.router
            .with_pool(|pool| pool.book_mut().replace_remote(replica, bookings));
    }

    /// Forgets a peer's bookings (it went silent); returns how many.
    fn drop_replica(&self, replica: &str) -> usize {
        self.router
            .with_pool(|pool| pool.book_mut().drop_replica(replica))
    }

    /// Requests the peer replica has booked here.
    fn remote_bookings(&self, replica: &str) -> usize {
        self.router
            .with_pool(|pool| pool.book().remote_len(replica))
    }

    /// Whether the peer replica's request is booked here.
    fn knows_remote(&self, replica: &str, request_id: &str) -> bool {
        self.router
            .with_pool(|pool| pool.book().contains_remote(replica, request_id))
    }
}

/// The prompt's token count from its `tokens` count and `tokens_u32le`
/// byte length; ValueError unless exactly one is set, whole and within
/// `max_tokens`.
#[pyfunction]
pub fn prompt_length(tokens: usize, packed_bytes: usize, max_tokens: usize) -> PyResult<usize> {
    wire::prompt_length(tokens, packed_bytes, max_tokens).map_err(PyValueError::new_err)
}

/// Raises ValueError unless the namespace is printable and at most
/// `max_chars` characters long.
#[pyfunction]
pub fn check_namespace(namespace: &str, max_chars: usize) -> PyResult<()> {
    wire::check_namespace(namespace, max_chars).map_err(PyValueError::new_err)
}

/// Raises ValueError unless the model name is printable and at most
/// `max_chars` characters long.
#[pyfunction]
pub fn check_model(model: &str, max_chars: usize) -> PyResult<()> {
    wire::check_model(model, max_chars).map_err(PyValueError::new_err)
}
