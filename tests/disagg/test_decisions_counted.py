"""Every way into the router decides through the core's one decision path,
so every decision is counted and logged: `Route`, `RouteStream` and proxied
`Generate` all reach `kvrouter_decisions_total`, the routing histograms and
the decision log of a real router process."""

from __future__ import annotations

import json
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_until

from kvrouter.client import RouterClient
from kvrouter.demo.cluster import free_port

from .conftest import start_cluster
from .helpers import generate, prompt


@pytest.fixture(scope="module")
def cluster(tiny_model, tmp_path_factory):
    port = free_port()
    flags = ["--metrics-listen", f"127.0.0.1:{port}", "--log-format", "json"]
    cluster = start_cluster(
        tiny_model, tmp_path_factory, {}, [], router_args=[*flags, "--log-decisions", "true"]
    )
    cluster.metrics_url = f"http://127.0.0.1:{port}/metrics"
    yield cluster
    cluster.stop()


def scrape(url: str) -> dict[str, float]:
    """Sample name (with labels) -> value."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "le")
            if "le" not in s.labels:
                samples[f"{s.name}{{{labels}}}"] = s.value
    return samples


def logged_ids(cluster) -> set[str]:
    lines = (cluster.log_dir / "router.log").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    return {r["request_id"] for r in records if r.get("logger") == "kvrouter.decisions"}


def decisions(samples: dict[str, float], role: str) -> float:
    return sum(v for k, v in samples.items() if k.startswith("kvrouter_decisions_total{") and
               f"role={role}" in k)  # fmt: skip


def test_route_routestream_and_generate_are_all_counted_and_logged(cluster):
    with RouterClient(cluster.target) as router:
        routed = router.route(prompt(1, 40), request_id="via-route")
        router.finished(routed.request_id)
        (streamed,) = router.route_many([prompt(2, 40)], request_ids=["via-stream"])
        router.finished(streamed.request_id)
    generated = generate(cluster.target, prompt(3, 300), 4, request_id="via-generate")
    assert generated.stats.disaggregated

    wanted = {"via-route", "via-stream", "via-generate"}
    wait_until(lambda: wanted <= logged_ids(cluster), what="all three decisions in the log")
    samples = scrape(cluster.metrics_url)
    # Three decode decisions; only the long Generate was split off to a prefill worker.
    assert decisions(samples, "decode") == 3
    assert decisions(samples, "prefill") == 1
    assert samples["kvrouter_routing_latency_seconds_count{}"] == 3
    assert samples["kvrouter_overlap_ratio_count{}"] == 3
