"""What the front door measures of each request: Prometheus metrics per
model and HTTP route, and one JSON log line per request (logger
"kvrouter.http") keyed by the request id the decision log also uses.

A `RequestRecord` follows one request from its arrival; `FrontDoorMetrics.done`
is the one place a request is counted and logged, whatever way it ended."""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from kvrouter.service.metrics import cumulative_buckets

log = logging.getLogger("kvrouter.http")

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
QUEUE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# A model label is what the request named (a served model, and any adapter
# after its colon or by its own name, known or not): past this many label
# sets, requests of a model not yet seen are counted under OTHER_MODEL, so
# that clients naming made-up adapters cannot grow the router's memory and
# every scrape.
MAX_SERIES = 1024
OTHER_MODEL = "(other)"


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


class Tally:
    """A histogram's per-bucket counts (+Inf last) and sum, as plain
    numbers: an observation costs a bisect and two additions, where a
    prometheus_client Histogram takes a lock and walks its buckets in Python
    (about 1.3 µs, several times a request). Only the event loop adds; a
    scrape, on the metrics server's thread, may read one observation's count
    before its sum, which the next scrape settles."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # Prometheus's buckets hold what is at or below their bound.
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class _Series:
    """One (model, route)'s figures."""

    __slots__ = ("by_status", "ttft", "itl", "e2e", "prompt_tokens", "generation_tokens")

    def __init__(self) -> None:
        self.by_status: dict[int, int] = {}
        self.ttft = Tally(LATENCY_BUCKETS)
        self.itl = Tally(ITL_BUCKETS)
        self.e2e = Tally(LATENCY_BUCKETS)
        self.prompt_tokens = 0
        self.generation_tokens = 0


class FrontDoorMetrics:
    """The front door's Prometheus metrics. Requests are counted into plain
    numbers (`_Series`, `Tally`) and turned into metric families only when
    /metrics is scraped, as the routing figures are (service/metrics.py)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._series: dict[tuple[str, str], _Series] = {}
        self._queued: dict[tuple[str, str], Tally] = {}
        self.queue_depth = Gauge(
            "kvrouter_http_queue_depth",
            "Requests waiting in the admission queue",
            ["model", "priority"],
            registry=registry,
        )
        registry.register(self)

    def done(self, record: RequestRecord) -> None:
        """Counts and logs a request that has ended."""
        series = _entry(self._series, record.model, record.route, _Series)
        series.by_status[record.status] = series.by_status.get(record.status, 0) + 1
        ended = time.monotonic()
        series.e2e.observe(ended - record.arrived)
        if record.first_token is not None:
            series.ttft.observe(record.first_token - record.arrived)
            for gap in record.gaps:
                series.itl.observe(gap)
        if record.status == 200:
            series.prompt_tokens += record.prompt_tokens
        series.generation_tokens += record.completion_tokens
        if log.isEnabledFor(logging.INFO):
            log.info("request", extra={"fields": _log_fields(record, ended)})

    def queued(self, record: RequestRecord) -> None:
        """Observes the time `record` waited for admission."""
        tally = _entry(self._queued, record.model, record.priority, lambda: Tally(QUEUE_BUCKETS))
        tally.observe(record.queue_s)

    def collect(self):
        """The metric families, at scrape time (prometheus_client's Collector)."""
        labels = ["model", "route"]
        requests = CounterMetricFamily(
            "kvrouter_http_requests",
            "Front-door requests by model, HTTP route and status code",
            labels=[*labels, "status"],
        )
        ttft = HistogramMetricFamily(
            "kvrouter_http_time_to_first_token_seconds",
            "From a request's arrival to its first token",
            labels=labels,
        )
        itl = HistogramMetricFamily(
            "kvrouter_http_inter_token_latency_seconds",
            "Time between a request's tokens as its client sees them",
            labels=labels,
        )
        e2e = HistogramMetricFamily(
            "kvrouter_http_request_duration_seconds",
            "From a request's arrival to its last byte",
            labels=labels,
        )
        prompt_tokens = CounterMetricFamily(
            "kvrouter_http_prompt_tokens", "Prompt tokens of answered requests", labels=labels
        )
        generation_tokens = CounterMetricFamily(
            "kvrouter_http_generation_tokens",
            "Tokens generated for front-door requests",
            labels=labels,
        )
        for (model, route), series in list(self._series.items()):
            for status, count in list(series.by_status.items()):
                requests.add_metric([model, route, str(status)], count)
            for family, tally in ((ttft, series.ttft), (itl, series.itl), (e2e, series.e2e)):
                _add_tally(family, [model, route], tally)
            prompt_tokens.add_metric([model, route], series.prompt_tokens)
            generation_tokens.add_metric([model, route], series.generation_tokens)
        queue = HistogramMetricFamily(
            "kvrouter_http_queue_seconds",
            "Time a request waited in the admission queue",
            labels=["model", "priority"],
        )
        for (model, priority), tally in list(self._queued.items()):
            _add_tally(queue, [model, priority], tally)
        yield from (requests, ttft, itl, e2e, prompt_tokens, generation_tokens, queue)


def _entry(entries: dict, model: str, label: str, make):
    """The entry of (model, label), made on first use; under OTHER_MODEL once
    `entries` holds MAX_SERIES and this one is new."""
    entry = entries.get((model, label))
    if entry is None:
        if len(entries) >= MAX_SERIES:
            model = OTHER_MODEL
            entry = entries.get((model, label))
        if entry is None:
            entry = entries[(model, label)] = make()
    return entry


def _add_tally(family: HistogramMetricFamily, labels: list[str], tally: Tally) -> None:
    counts, total = list(tally.counts), tally.sum
    family.add_metric(labels, cumulative_buckets(tally.bounds, counts), sum_value=total)


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
