"""The front door's admission control, metrics and request log against a
real router and CPU workers: past the running bound requests wait in the
queue (none lost, none hanging), the `high` class goes first, a full queue
is 429 and a wait past the deadline 503 (both with Retry-After), and each
request is one JSON log line under the id the decision log also uses.

The running places are held by streams whose workers are paused (SIGSTOP)
once the streams have begun, so that they cannot end on their own."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import urllib.request

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_until

from kvrouter.demo.cluster import free_port

from .conftest import start_cluster
from .helpers import all_idle, http_get, http_post

MODEL = "tiny"
RUNNING = 2
QUEUED = 2
QUEUE_TIMEOUT_S = 3
HOLD = {"temperature": 0, "max_tokens": 300, "stream": True, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def front_door(tiny_model, tmp_path_factory):
    port, metrics = free_port(), free_port()
    cluster = start_cluster(
        tiny_model,
        tmp_path_factory,
        {},
        [],
        [
            "--http-listen",
            f"127.0.0.1:{port}",
            "--served-models",
            f"{MODEL}={tiny_model}",
            "--metrics-listen",
            f"127.0.0.1:{metrics}",
            "--log-format",
            "json",
            "--log-decisions",
            "true",
            "--http-max-requests",
            str(RUNNING),
            "--http-max-queued",
            str(QUEUED),
            "--http-queue-timeout-s",
            str(QUEUE_TIMEOUT_S),
            # Paused workers stay registered for the length of a test.
            "--heartbeat-ttl-s",
            "120",
        ],
        roles=["both", "both"],
        models=[MODEL, MODEL],
    )
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_get(base + "/ready")[0] == 200, what="the front door to be ready")
    cluster.metrics_url = f"http://127.0.0.1:{metrics}/metrics"
    yield cluster, base
    cluster.stop()


@pytest.fixture
def client(front_door):
    cluster, base = front_door
    with openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0) as client:
        yield client
    wait_until(lambda: all_idle(cluster), what="every worker to be idle")


def queue_depth(cluster, priority: str) -> float:
    with urllib.request.urlopen(cluster.metrics_url, timeout=10) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "kvrouter_http_queue_depth" and sample.labels == {
                "model": MODEL,
                "priority": priority,
            }:
                return sample.value
    return 0.0


@contextlib.contextmanager
def all_places_held(cluster, client):
    """Streams that take every running place, begun on their workers, which
    are then paused; on leaving, the workers go on and the streams end."""
    held = [
        client.completions.create(model=MODEL, prompt=f"hold {i}", **HOLD) for i in range(RUNNING)
    ]
    for stream in held:
        next(iter(stream))
    for process in cluster.workers.values():
        os.kill(process.pid, signal.SIGSTOP)
    try:
        yield held
    finally:
        for process in cluster.workers.values():
            os.kill(process.pid, signal.SIGCONT)
        for stream in held:
            stream.close()


class Waiter(threading.Thread):
    """A whole completion sent in the background; `status` once it ends."""

    def __init__(self, base: str, priority: str | None = None) -> None:
        super().__init__(daemon=True)
        self.base, self.priority, self.status = base, priority, None
        self.start()

    def run(self) -> None:
        body = json.dumps({"model": MODEL, "prompt": "queued", "max_tokens": 2}).encode()
        headers = {"x-kvrouter-priority": self.priority} if self.priority else {}
        self.status, _, self.answer = http_post(self.base + "/v1/completions", body, headers)


def test_past_the_bound_requests_wait_and_past_the_queue_get_429(front_door, client):
    cluster, base = front_door
    with all_places_held(cluster, client):
        waiters = [Waiter(base) for _ in range(QUEUED)]
        wait_until(lambda: queue_depth(cluster, "normal") == QUEUED, what="both to wait")
        body = json.dumps({"model": MODEL, "prompt": "one more", "max_tokens": 2}).encode()
        status, headers, answer = http_post(base + "/v1/completions", body)
        assert status == 429
        assert headers["retry-after"] == "1"
        assert "waiting" in answer["error"]["message"]
    for waiter in waiters:
        waiter.join(60)
        assert waiter.status == 200, waiter.answer
    assert queue_depth(cluster, "normal") == 0


def test_the_high_class_is_admitted_before_the_normal_one(front_door, client):
    cluster, base = front_door
    with all_places_held(cluster, client) as held:
        normal = Waiter(base)
        wait_until(lambda: queue_depth(cluster, "normal") == 1, what="the normal one to wait")
        high = Waiter(base, "high")
        wait_until(lambda: queue_depth(cluster, "high") == 1, what="the high one to wait")
        held[0].close()
        # The freed place goes to the high one, which then waits on its
        # paused worker: the normal one is still queued.
        wait_until(lambda: queue_depth(cluster, "high") == 0, what="the high one to be admitted")
        assert queue_depth(cluster, "normal") == 1
    for waiter in (high, normal):
        waiter.join(60)
        assert waiter.status == 200, waiter.answer


def test_a_request_that_waits_past_the_deadline_gets_503(front_door, client):
    cluster, base = front_door
    with all_places_held(cluster, client):
        body = json.dumps({"model": MODEL, "prompt": "too late", "max_tokens": 2}).encode()
        status, headers, answer = http_post(base + "/v1/completions", body)
    assert status == 503
    assert headers["retry-after"] == "1"
    assert f"within {QUEUE_TIMEOUT_S} s" in answer["error"]["message"]


def test_a_bad_priority_is_400(front_door):
    _, base = front_door
    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1}).encode()
    status, _, answer = http_post(base + "/v1/completions", body, {"x-kvrouter-priority": "vip"})
    assert status == 400
    assert "x-kvrouter-priority" in answer["error"]["message"]


def test_each_request_is_one_log_line_under_its_decision_id(front_door, client):
    cluster, _ = front_door
    answer = client.completions.create(
        model=MODEL, prompt="logged", max_tokens=3, temperature=0, extra_body={"ignore_eos": True}
    )

    def records():
        lines = (cluster.log_dir / "router.log").read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def logged(name):
        return [
            r for r in records() if r.get("logger") == name and r.get("request_id") == answer.id
        ]

    wait_until(lambda: logged("kvrouter.http") and logged("kvrouter.decisions"), what="both lines")
    (line,) = logged("kvrouter.http")
    assert line["status"] == 200
    assert line["route"] == "/v1/completions"
    assert (line["completion_tokens"], line["finish_reason"]) == (3, "length")
    assert line["prompt_tokens"] == answer.usage.prompt_tokens
    assert line["ttft_ms"] <= line["e2e_ms"]


def test_cached_prompt_tokens_are_reported(client):
    prompt = "a shared beginning that spans several blocks of the cache " * 4
    for _ in range(2):
        answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert answer.usage.prompt_tokens_details.cached_tokens > 0


def test_a_bad_session_header_is_400(front_door):
    _, base = front_door
    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1}).encode()
    status, _, answer = http_post(base + "/v1/completions", body, {"x-session-id": "x" * 257})
    assert status == 400
    assert "x-session-id" in answer["error"]["message"]
