"""Prometheus metrics of one router instance, on a registry of its own (so
several instances can live in one process, as in tests).

Per-decision figures are counted by the Rust core as it decides and turned
into metric families only when /metrics is scraped: prometheus_client's own
Counter and Histogram cost more per update than the decision itself.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from kvrouter import _core
from kvrouter.service.metrics_http import serve_metrics

LAG_BUCKETS = (1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0, 5.0, 30.0)


def cumulative_buckets(bounds, counts) -> list[tuple[str, int]]:
    """Prometheus's buckets (upper bound, observations at or below it) from
    per-bucket counts, `counts` having one more entry than `bounds`: +Inf."""
    cumulative, running = [], 0
    for bound, count in zip((*map(str, bounds), "+Inf"), counts, strict=True):
        running += count
        cumulative.append((bound, running))
    return cumulative


def histogram_family(name: str, doc: str, histogram: _core.Histogram) -> HistogramMetricFamily:
    """A histogram from the core's per-bucket counts (+Inf last)."""
    buckets = cumulative_buckets(histogram.bounds, histogram.counts)
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=histogram.sum)


class DecisionStats:
    """The routing hot path's figures, kept by the core and read at scrape
    time through `read_from`'s callable."""

    def __init__(self) -> None:
        self._read: Callable[[], _core.RouteStats] | None = None

    def read_from(self, read: Callable[[], _core.RouteStats]) -> None:
        """`read()` returns the router's `RouteStats` (`Router.stats`)."""
        self._read = read

    def collect(self):
        if self._read is None:
            return
        stats = self._read()
        decisions = CounterMetricFamily(
            "kvrouter_decisions",
            "Routing decisions by chosen worker and role",
            labels=["worker", "role"],
        )
        for worker, role, count in stats.decisions:
            decisions.add_metric([str(worker), role], count)
        errors = CounterMetricFamily(
            "kvrouter_route_errors", "Refused routing requests by status code", labels=["code"]
        )
        for code, count in stats.errors:
            errors.add_metric([code], count)
        retired = CounterMetricFamily(
            "kvrouter_bookings_retired",
            "Bookings retired because their worker's load report no longer counted them "
            "(a finished or cancelled report that never came)",
        )
        retired.add_metric([], stats.retired_unreported)
        affinity = CounterMetricFamily(
            "kvrouter_session_affinity",
            "Decisions a session's last worker won among candidates tied on cost",
        )
        affinity.add_metric([], stats.by_affinity)
        yield decisions
        yield errors
        yield retired
        yield affinity
        yield histogram_family(
            "kvrouter_routing_latency_seconds",
            "Time to decide one request, in the router",
            stats.latency,
        )
        yield histogram_family(
            "kvrouter_overlap_ratio",
            "Cached share of the prompt's blocks on the decode worker",
            stats.overlap,
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
        self.event_streams_closed = Counter(
            "kvrouter_event_streams_closed",
            "Publish streams the router closed, by reason (unread: the worker "
            "left its replies unread for event_ack_timeout_s)",
            ["reason"],
            registry=r,
        )
        self.expirations = Counter(
            "kvrouter_worker_expirations", "Workers removed for missing heartbeats", registry=r
        )

    def gauge(self, name: str, doc: str, read: Callable[[], float]) -> None:
        """A gauge read at scrape time."""
        Gauge(name, doc, registry=self.registry).set_function(read)

    def serve(self, listen: str, *, authorized, ssl_context=None) -> tuple[object, int]:
        """Starts the /metrics endpoint (`metrics_http.serve_metrics`);
        returns (server, bound port)."""
        server = serve_metrics(
            self.registry, listen, authorized=authorized, ssl_context=ssl_context
        )
        return server, server.server_address[1]
