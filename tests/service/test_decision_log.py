"""Decision log lines: valid JSON, one per decision, with the request id."""

from __future__ import annotations

import io
import json
import logging

from kvrouter.service import logs
from kvrouter.service.decision_log import DecisionLog


def test_lines_are_json_with_every_field(monkeypatch):
    stream = io.StringIO()
    logs.configure("info", "json")
    handler = logging.getLogger("kvrouter").handlers[0]
    monkeypatch.setattr(handler, "stream", stream)
    log = DecisionLog(enabled=True)
    records = [
        (1.0, 'r"1', 3, None, 10, 5, 1.25, "worker 3 \u00e9", 12.5),
        (2.0, "r2", 4, 7, 2, 0, float("inf"), "tie", 3.0),
    ]
    log.read_from(lambda: records)
    log.flush()
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["request_id"] == 'r"1' and first["prefill_worker"] is None
    assert first["reason"] == "worker 3 \u00e9" and first["msg"] == "routed"
    assert second["prefill_worker"] == 7 and second["ttft_ms"] is None
    logging.getLogger("kvrouter").handlers.clear()
