"""The front door's metrics as a scrape reads them: every request counted
once by model, route and status; TTFT, inter-token gaps, end-to-end time and
queue time in the same buckets, counts and sums that prometheus_client's own
Histogram gives for the same observations; prompt tokens only for answered
requests; and clients naming made-up models cannot grow the series without
bound."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvrouter.service.openai.observed import (
    ITL_BUCKETS,
    LATENCY_BUCKETS,
    MAX_SERIES,
    OTHER_MODEL,
    QUEUE_BUCKETS,
    FrontDoorMetrics,
    RequestRecord,
    Tally,
)

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def reference(bounds: tuple[float, ...], values: list[float]) -> dict[str, float]:
    """prometheus_client's own exposition of `values`: bucket -> count, and
    the count and sum."""
    registry = CollectorRegistry()
    histogram = Histogram("h", "h", buckets=bounds, registry=registry)
    for value in values:
        histogram.observe(value)
    return {
        s.labels.get("le", s.name): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
        if s.name != "h_created"
    }


def histogram(found: dict, name: str, labels: dict[str, str]) -> dict[str, float]:
    """The scraped histogram `name` of `labels`, keyed as `reference` keys it."""
    out = {}
    for (sample, sample_labels), value in found.items():
        sample_labels = dict(sample_labels)
        le = sample_labels.pop("le", None)
        if sample_labels != labels or not sample.startswith(name + "_"):
            continue
        suffix = sample.removeprefix(name + "_")
        if suffix in ("bucket", "count", "sum"):
            out[le if suffix == "bucket" else "h_" + suffix] = value
    return out


@pytest.mark.parametrize(
    "bounds", [LATENCY_BUCKETS, ITL_BUCKETS, QUEUE_BUCKETS], ids=["latency", "itl", "queue"]
)
def test_a_tally_buckets_as_prometheus_client_does(bounds):
    # On each bound (a bucket holds what is at or below it), between, past
    # the last, and zero.
    values = [*bounds, *(b * 0.999 for b in bounds), bounds[-1] * 2, 0.0]
    tally = Tally(bounds)
    for value in values:
        tally.observe(value)
    assert tally.counts == counts_of(reference(bounds, values), bounds)
    assert tally.sum == pytest.approx(sum(values))


def counts_of(exposition: dict[str, float], bounds: tuple[float, ...]) -> list[int]:
    """Per-bucket counts (+Inf last) from cumulative ones."""
    cumulative = [exposition[str(float(b))] for b in bounds] + [exposition["+Inf"]]
    return [int(c - p) for c, p in zip(cumulative, [0, *cumulative[:-1]], strict=True)]


def test_queue_time_scrapes_as_prometheus_client_exposes_it():
    values = [0.0, 0.001, 0.004, 0.2, 0.2, 31.0]
    registry = CollectorRegistry()
    metrics = FrontDoorMetrics(registry)
    for value in values:
        metrics.queued(RequestRecord(COMPLETIONS, model="m", queue_s=value))
    labels = {"model": "m", "priority": "normal"}
    found = histogram(samples(registry), "kvrouter_http_queue_seconds", labels)
    assert found == reference(QUEUE_BUCKETS, values)


def record(route: str, model: str, *, status: int = 200, gaps=(), queue_s=0.0) -> RequestRecord:
    r = RequestRecord(route, model=model, arrived=100.0, queue_s=queue_s)
    r.first_token = 100.02
    r.gaps = list(gaps)
    r.prompt_tokens, r.completion_tokens = 7, 1 + len(gaps)
    r.status = status
    return r


def test_requests_are_counted_by_model_route_and_status():
    registry = CollectorRegistry()
    metrics = FrontDoorMetrics(registry)
    done = [
        record(COMPLETIONS, "a", gaps=[0.002, 0.004]),
        record(COMPLETIONS, "a", gaps=[0.03]),
        record(COMPLETIONS, "a", status=400),
        record(CHAT, "b", queue_s=0.2),
    ]
    for r in done:
        metrics.queued(r)
        metrics.done(r)
    found = samples(registry)

    def value(name, **labels):
        return found[(name, frozenset(labels.items()))]

    a = {"model": "a", "route": COMPLETIONS}
    b = {"model": "b", "route": CHAT}
    assert value("kvrouter_http_requests_total", status="200", **a) == 2
    assert value("kvrouter_http_requests_total", status="400", **a) == 1
    assert value("kvrouter_http_requests_total", status="200", **b) == 1
    # Prompt tokens count answered requests only; generated tokens all.
    assert value("kvrouter_http_prompt_tokens_total", **a) == 14
    assert value("kvrouter_http_generation_tokens_total", **a) == 3 + 2 + 1
    itl = histogram(found, "kvrouter_http_inter_token_latency_seconds", a)
    assert itl == reference(ITL_BUCKETS, [0.002, 0.004, 0.03])
    ttft = histogram(found, "kvrouter_http_time_to_first_token_seconds", b)
    assert ttft["h_count"] == 1 and ttft["h_sum"] == pytest.approx(0.02)
    assert histogram(found, "kvrouter_http_request_duration_seconds", a)["h_count"] == 3
    queue = histogram(found, "kvrouter_http_queue_seconds", {"model": "b", "priority": "normal"})
    assert queue == reference(QUEUE_BUCKETS, [0.2])


def test_made_up_models_cannot_grow_the_series_without_bound():
    registry = CollectorRegistry()
    metrics = FrontDoorMetrics(registry)
    sent = MAX_SERIES + 200
    for i in range(sent):
        r = record(COMPLETIONS, f"tiny:made-up-{i}", status=404)
        metrics.queued(r)
        metrics.done(r)
    metrics.done(record(COMPLETIONS, "tiny:made-up-0"))
    found = samples(registry)
    counted = {
        (dict(labels)["model"], dict(labels)["status"]): value
        for (name, labels), value in found.items()
        if name == "kvrouter_http_requests_total"
    }
    assert len({model for model, _ in counted}) == MAX_SERIES + 1
    assert counted[(OTHER_MODEL, "404")] == sent - MAX_SERIES
    assert sum(counted.values()) == sent + 1
    # A model seen before the bound keeps its own series.
    assert counted[("tiny:made-up-0", "200")] == 1
    queued = {
        dict(labels)["model"]
        for (name, labels) in found
        if name == "kvrouter_http_queue_seconds_count"
    }
    assert len(queued) == MAX_SERIES + 1 and OTHER_MODEL in queued
