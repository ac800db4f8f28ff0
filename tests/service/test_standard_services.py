"""What standard tools see: grpc.health.v1, server reflection and /metrics."""

from __future__ import annotations

import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from prometheus_client.parser import text_string_to_metric_families

from .helpers import prompt


def test_health_answers_serving(router):
    with grpc.insecure_channel(router.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "kvrouter.v1.Router", "kvrouter.v1.KvEvents"):
            response = health.Check(health_pb2.HealthCheckRequest(service=service))
            assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_and_describes_the_services(router):
    with grpc.insecure_channel(router.target) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {
            "kvrouter.v1.Router",
            "kvrouter.v1.Registry",
            "kvrouter.v1.KvEvents",
            "grpc.health.v1.Health",
        } <= services
        route = database.FindFileContainingSymbol("kvrouter.v1.Router")
        assert route.package == "kvrouter.v1"


def test_metrics_endpoint_scrapes(router):
    router.worker(1, capacity_blocks=120_000)
    router.client().route(prompt(seed=1, blocks=4))
    router.server.index.wait_sized()
    text = scrape(router)
    for name in (
        'kvrouter_decisions_total{role="decode",worker="1"} 1.0',
        "kvrouter_routing_latency_seconds_count 1.0",
        "kvrouter_overlap_ratio_bucket",
        "kvrouter_index_blocks",
        "kvrouter_registered_workers 1.0",
        "kvrouter_event_gaps_total",
        "kvrouter_resyncs_total",
        "kvrouter_event_lag_seconds",
    ):
        assert name in text, name
    # The index is sized for the worker's 120,000 blocks: one home of 8 bytes a
    # block, 2^17 homes (room for all of them at the tables' 7/8 load would be 2^18).
    assert samples(text)["kvrouter_index_table_bytes"] == (2**17 + 64) * 8


def test_an_index_left_to_grow_is_not_sized_for_its_workers(start_router):
    """`size_index = false`: registering a worker leaves the index's tables to
    grow with the index, as they would under a bare PrefixIndex."""
    router = start_router(size_index=False)
    router.worker(1, capacity_blocks=120_000)
    router.client().route(prompt(seed=1, blocks=4))
    assert samples(scrape(router))["kvrouter_index_table_bytes"] == 0


def scrape(router) -> str:
    url = f"http://127.0.0.1:{router.server.metrics_port}/metrics"
    return urllib.request.urlopen(url, timeout=10).read().decode()


def samples(text: str) -> dict[str, float]:
    """Each sample's value by name (the last, where labels tell several apart)."""
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
