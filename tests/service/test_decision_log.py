"""Decision log lines: valid JSON, one per decision, with the request id,
and the same fields in the text format."""

from __future__ import annotations

import io
import json
import logging

import pytest

from kvrouter.net import logs
from kvrouter.policy import PolicyConfig
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.service.decision_log import DecisionLog

from .test_route_wire import CACHED, deployment


@pytest.fixture
def captured(request):
    def configure(fmt: str) -> io.StringIO:
        stream = io.StringIO()
        logs.configure("info", fmt)
        logging.getLogger("kvrouter").handlers[0].stream = stream
        return stream

    yield configure
    logging.getLogger("kvrouter").handlers.clear()


def decide_two(log: DecisionLog) -> None:
    router = deployment(PolicyConfig())
    log.read_from(router.take_decision_lines)
    for request_id in ('r"1 \u00e9', "r2"):
        request = pb.RouteRequest(request_id=request_id, tokens=CACHED, namespace="m")
        router.route_wire(request.SerializeToString())
    log.flush()


def test_lines_are_json_with_every_field(captured):
    stream = captured("json")
    decide_two(DecisionLog())
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["request_id"] == 'r"1 \u00e9' and second["request_id"] == "r2"
    assert first["msg"] == "routed" and first["logger"] == "kvrouter.decisions"
    assert first["prefill_worker"] is None and first["decode_worker"] in (1, 2)
    assert first["blocks"] == len(CACHED) // 4 and first["reason"]
    assert first["ttft_ms"] > 0 and first["us"] > 0 and first["ts"] > 0


def test_text_lines_carry_the_same_fields(captured):
    stream = captured("text")
    decide_two(DecisionLog())
    first, second = stream.getvalue().splitlines()
    assert 'kvrouter.decisions: routed request_id=r"1 \u00e9 decode_worker=' in first
    assert "request_id=r2" in second and "prefill_worker=None" in second


def test_flushing_twice_writes_each_decision_once(captured):
    stream = captured("json")
    log = DecisionLog()
    decide_two(log)
    log.flush()
    assert len(stream.getvalue().splitlines()) == 2
