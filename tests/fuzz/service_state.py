"""The router's state objects without a server: what the service's input
paths (event ingestion, routing) are fuzzed against."""

from __future__ import annotations

import asyncio
import dataclasses

from kvrouter._core import PrefixIndex
from kvrouter.proto_gen import router_pb2 as pb
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
            self.index,
            self.workers,
            self.metrics,
            stream_ttl_s=self.config.event_stream_ttl_s,
            ack_timeout_s=self.config.event_ack_timeout_s,
            max_batch_events=self.config.max_batch_events,
        )
        self.routing = RouterService(self.policy, self.workers, self.metrics, self.config)

    def ingest(self, batch: pb.EventBatch | bytes):
        """Applies one batch, given as the message or as its serialized body,
        as a Publish stream would."""
        return asyncio.run(self.events.ingest(WORKER, publish_request(batch)))

    def snapshot(self):
        """What a refused input must leave unchanged, once the index's
        sizing thread has sized it for the worker (its table bytes)."""
        self.index.wait_sized()
        return self.index.stats(), self.index.workers(), self.policy.load(WORKER)


def publish_request(batch: pb.EventBatch | bytes) -> bytes:
    """The serialized PublishRequest of a batch, given as the message or as
    its serialized body."""
    body = batch.SerializeToString() if isinstance(batch, pb.EventBatch) else batch
    return b"\x12" + _varint(len(body)) + body  # PublishRequest field 2: the batch


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
