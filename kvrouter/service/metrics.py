"""Prometheus metrics of one router instance, on a registry of its own (so
several instances can live in one process, as in tests).

Per-decision figures are plain counters bumped on the hot path and turned
into metric families only when /metrics is scraped: prometheus_client's own
Counter and Histogram take a lock per update, which at tens of thousands of
decisions a second costs more than the decision's bookkeeping should.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

LATENCY_BUCKETS = (
    1e-5,
    2.5e-5,
    5e-5,
    7.5e-5,
    1e-4,
    1.5e-4,
    2e-4,
    3e-4,
    5e-4,
    7.5e-4,
    1e-3,
    1.5e-3,
    2e-3,
    3e-3,
    5e-3,
    1e-2,
    5e-2,
    0.25,
    1.0,
)
RATIO_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)
LAG_BUCKETS = (1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0, 5.0, 30.0)


class FastHistogram:
    """Bucket counts without a lock; the event loop is the only writer."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.total += value

    def family(self, name: str, doc: str) -> HistogramMetricFamily:
        cumulative, running = [], 0
        for bound, count in zip((*map(str, self.buckets), "+Inf"), self.counts, strict=True):
            running += count
            cumulative.append((bound, running))
        return HistogramMetricFamily(name, doc, buckets=cumulative, sum_value=self.total)


class DecisionStats:
    """The routing hot path's figures, collected at scrape time."""

    def __init__(self) -> None:
        self.decisions: Tally[tuple[int, str]] = Tally()
        self.errors: Tally[str] = Tally()
        self.latency = FastHistogram(LATENCY_BUCKETS)
        self.overlap = FastHistogram(RATIO_BUCKETS)

    def collect(self):
        decisions = CounterMetricFamily(
            "kvrouter_decisions",
            "Routing decisions by chosen worker and role",
            labels=["worker", "role"],
        )
        for (worker, role), count in sorted(self.decisions.items()):
            decisions.add_metric([str(worker), role], count)
        errors = CounterMetricFamily(
            "kvrouter_route_errors", "Refused routing requests by status code", labels=["code"]
        )
        for code, count in sorted(self.errors.items()):
            errors.add_metric([code], count)
        yield decisions
        yield errors
        yield self.latency.family(
            "kvrouter_routing_latency_seconds", "Time to decide one request, in the router"
        )
        yield self.overlap.family(
            "kvrouter_overlap_ratio", "Cached share of the prompt's blocks on the decode worker"
        )


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.routing = DecisionStats()
        r.register(self.routing)
        self.event_batches = Counter(
            "kvrouter_event_batches",
            "KV event batches received, by outcome",
            ["outcome"],
            registry=r,
        )
        self.event_gaps = Counter(
            "kvrouter_event_gaps",
            "Event batches that skipped ahead of a worker's stream",
            registry=r,
        )
        self.event_lag = Histogram(
            "kvrouter_event_lag_seconds",
            "From a batch being cut on the worker to being applied",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.resyncs = Counter(
            "kvrouter_resyncs", "Resyncs requested from workers, by reason", ["reason"], registry=r
        )
        self.expirations = Counter(
            "kvrouter_worker_expirations", "Workers removed for missing heartbeats", registry=r
        )

    def gauge(self, name: str, doc: str, read: Callable[[], float]) -> None:
        """A gauge read at scrape time."""
        Gauge(name, doc, registry=self.registry).set_function(read)

    def serve(self, listen: str) -> tuple[object, int]:
        """Starts the /metrics HTTP endpoint; returns (server, bound port)."""
        host, _, port = listen.rpartition(":")
        server, _thread = start_http_server(
            int(port), addr=host.strip("[]") or "0.0.0.0", registry=self.registry
        )
        return server, server.server_address[1]
