"""Prometheus metrics of one router instance, on a registry of its own (so
several instances can live in one process, as in tests)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

LATENCY_BUCKETS = (2.5e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2, 0.25, 1.0)
RATIO_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)
LAG_BUCKETS = (1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0, 5.0, 30.0)


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.decisions = Counter(
            "kvrouter_decisions",
            "Routing decisions by chosen worker and role",
            ["worker", "role"],
            registry=r,
        )
        self.route_errors = Counter(
            "kvrouter_route_errors", "Refused routing requests by status code", ["code"], registry=r
        )
        self.overlap_ratio = Histogram(
            "kvrouter_overlap_ratio",
            "Cached share of the prompt's blocks on the decode worker",
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        self.routing_latency = Histogram(
            "kvrouter_routing_latency_seconds",
            "Time to decide one request, in the router",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
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
        self._decision_children: dict[tuple[int, str], Counter] = {}

    def count_decision(self, worker_id: int, role: str) -> None:
        child = self._decision_children.get((worker_id, role))
        if child is None:
            child = self.decisions.labels(worker=str(worker_id), role=role)
            self._decision_children[(worker_id, role)] = child
        child.inc()

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
