"""The router's state objects without a server: what the service's input
paths (event ingestion, routing) are fuzzed against."""

from __future__ import annotations

import dataclasses

from kvrouter._core import PrefixIndex
from kvrouter.service.config import ServiceConfig
from kvrouter.service.events import EventIngest
from kvrouter.service.metrics import ServiceMetrics
from kvrouter.service.routing import RouterService, service_router
from kvrouter.service.workers import WorkerRecord, WorkerTable

BLOCK = 4
WORKER = 1


class ServiceState:
    def __init__(self, **config) -> None:
        defaults = dict(block_size=BLOCK, log_decisions=False, max_prompt_tokens=64)
        self.config = dataclasses.replace(ServiceConfig(), **{**defaults, **config})
        self.index = PrefixIndex(BLOCK)
        self.policy = service_router(self.index, self.config)
        self.metrics = ServiceMetrics()
        self.workers = WorkerTable(self.policy, self.index, self.config.heartbeat_ttl_s)
        self.workers.register(WorkerRecord(WORKER, "both", "w1:1", BLOCK, 10_000))
        self.events = EventIngest(
            self.index, self.workers, self.metrics, stream_ttl_s=self.config.event_stream_ttl_s
        )
        self.routing = RouterService(self.policy, self.workers, self.metrics, self.config)

    def snapshot(self):
        """What a refused input must leave unchanged."""
        return self.index.stats(), self.index.workers(), self.policy.load(WORKER)
