"""What the front door measures of each request: Prometheus metrics per
model and HTTP route, and one JSON log line per request (logger
"kvrouter.http") keyed by the request id the decision log also uses.

A `RequestRecord` follows one request from its arrival; `FrontDoorMetrics.done`
is the one place a request is counted and logged, whatever way it ended."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

log = logging.getLogger("kvrouter.http")

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
# Models are served names, routes and priorities the front door's own, so the
# label pairs are few; the bound only keeps a mistake from growing the cache.
MAX_CACHED_SERIES = 1024
QUEUE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class RequestRecord:
    route: str
    model: str = ""
    request_id: str = ""
    priority: str = "normal"
    arrived: float = field(default_factory=time.monotonic)
    queue_s: float = 0.0
    first_token: float | None = None
    last_token: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    status: int = 200
    error: str | None = None
    gaps: list[float] = field(default_factory=list)

    def tokens(self, count: int) -> None:
        """`count` tokens arrived now."""
        now = time.monotonic()
        if self.first_token is None:
            self.first_token = now
        elif count:
            self.gaps.append((now - self.last_token) / count)
        self.last_token = now
        self.completion_tokens += count

    def failed(self, status: int, message: str) -> None:
        self.status, self.error = status, message


class FrontDoorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        labels = ["model", "route"]
        self.requests = Counter(
            "kvrouter_http_requests",
            "Front-door requests by model, HTTP route and status code",
            [*labels, "status"],
            registry=r,
        )
        self.ttft = Histogram(
            "kvrouter_http_time_to_first_token_seconds",
            "From a request's arrival to its first token",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "kvrouter_http_inter_token_latency_seconds",
            "Time between a request's tokens as its client sees them",
            labels,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "kvrouter_http_request_duration_seconds",
            "From a request's arrival to its last byte",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "kvrouter_http_prompt_tokens", "Prompt tokens of answered requests", labels, registry=r
        )
        self.generation_tokens = Counter(
            "kvrouter_http_generation_tokens",
            "Tokens generated for front-door requests",
            labels,
            registry=r,
        )
        self.queue_time = Histogram(
            "kvrouter_http_queue_seconds",
            "Time a request waited in the admission queue",
            ["model", "priority"],
            buckets=QUEUE_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "kvrouter_http_queue_depth",
            "Requests waiting in the admission queue",
            ["model", "priority"],
            registry=r,
        )
        self._children: dict[tuple[str, str], _Series] = {}
        self._queue_children: dict[tuple[str, str], Histogram] = {}

    def done(self, record: RequestRecord) -> None:
        """Counts and logs a request that has ended."""
        series = self._series(record.model, record.route)
        series.requests(record.status).inc()
        ended = time.monotonic()
        series.e2e.observe(ended - record.arrived)
        if record.first_token is not None:
            series.ttft.observe(record.first_token - record.arrived)
            for gap in record.gaps:
                series.itl.observe(gap)
        if record.status == 200:
            series.prompt_tokens.inc(record.prompt_tokens)
        series.generation_tokens.inc(record.completion_tokens)
        if log.isEnabledFor(logging.INFO):
            log.info("request", extra={"fields": _log_fields(record, ended)})

    def queued(self, record: RequestRecord) -> None:
        """Observes the time `record` waited for admission."""
        key = (record.model, record.priority)
        child = _cached(self._queue_children, key, lambda: self.queue_time.labels(*key))
        child.observe(record.queue_s)

    def _series(self, model: str, route: str) -> _Series:
        key = (model, route)
        return _cached(self._children, key, lambda: _Series(self, model, route))


def _cached(cache: dict, key, make):
    """`cache[key]`, made once: a `labels` call locks and checks its labels
    each time it is made."""
    value = cache.get(key)
    if value is None:
        if len(cache) >= MAX_CACHED_SERIES:
            cache.clear()
        value = cache[key] = make()
    return value


class _Series:
    """One (model, route)'s metrics."""

    def __init__(self, metrics: FrontDoorMetrics, model: str, route: str) -> None:
        labels = (model, route)
        self._requests = metrics.requests
        self._labels = labels
        self._by_status: dict[int, Counter] = {}
        self.e2e = metrics.e2e.labels(*labels)
        self.ttft = metrics.ttft.labels(*labels)
        self.itl = metrics.itl.labels(*labels)
        self.prompt_tokens = metrics.prompt_tokens.labels(*labels)
        self.generation_tokens = metrics.generation_tokens.labels(*labels)

    def requests(self, status: int) -> Counter:
        return _cached(
            self._by_status, status, lambda: self._requests.labels(*self._labels, str(status))
        )


def _log_fields(record: RequestRecord, ended: float) -> dict:
    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds * 1e3, 3)

    fields = {
        "request_id": record.request_id,
        "model": record.model,
        "route": record.route,
        "status": record.status,
        "priority": record.priority,
        "prompt_tokens": record.prompt_tokens,
        "cached_tokens": record.cached_tokens,
        "completion_tokens": record.completion_tokens,
        "finish_reason": record.finish_reason,
        "queue_ms": ms(record.queue_s),
        "ttft_ms": ms(None if record.first_token is None else record.first_token - record.arrived),
        "e2e_ms": ms(ended - record.arrived),
    }
    if record.error is not None:
        fields["error"] = record.error
    return fields
