"""The decision log: one line per routing decision, keyed by request id, in
the same shape as the other structured logs (logger "kvrouter.decisions").

Records are buffered as tuples on the hot path and formatted and written in
one go every `FLUSH_INTERVAL_S` (and at shutdown): a logging call per
decision would cost more than the decision.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from kvrouter.service.logs import TextFormatter

FLUSH_INTERVAL_S = 0.05
MAX_PENDING = 4096
FIELDS = (
    "request_id",
    "decode_worker",
    "prefill_worker",
    "blocks",
    "overlap",
    "ttft_ms",
    "reason",
    "us",
)


class DecisionLog:
    def __init__(self, enabled: bool) -> None:
        self.logger = logging.getLogger("kvrouter.decisions")
        self.enabled = enabled and self.logger.isEnabledFor(logging.INFO)
        self._pending: list[tuple] = []

    def record(self, *values) -> None:
        """Values in FIELDS order, and the time."""
        self._pending.append((time.time(), values))
        if len(self._pending) >= MAX_PENDING:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        for handler in logging.getLogger("kvrouter").handlers:
            text = isinstance(handler.formatter, TextFormatter)
            lines = [self._format(ts, values, text) for ts, values in pending]
            stream = getattr(handler, "stream", None)
            if stream is not None:
                with handler.lock:
                    stream.write("\n".join(lines) + "\n")
                    stream.flush()

    @staticmethod
    def _format(ts: float, values: tuple, text: bool) -> str:
        if text:
            stamp = time.strftime("%H:%M:%S", time.localtime(ts))
            fields = " ".join(f"{k}={v}" for k, v in zip(FIELDS, values, strict=True))
            return f"{stamp} I kvrouter.decisions: routed {fields}"
        return json.dumps(
            {
                "ts": round(ts, 6),
                "level": "info",
                "logger": "kvrouter.decisions",
                "msg": "routed",
                **dict(zip(FIELDS, values, strict=True)),
            },
            separators=(",", ":"),
        )

    async def run(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            self.flush()
