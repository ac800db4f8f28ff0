"""The decision log: one line per routing decision, keyed by request id, in
the same shape as the other structured logs (logger "kvrouter.decisions").

The Rust core keeps a record of each decision as it makes it; they are
read, formatted and written in one go every `FLUSH_INTERVAL_S` (and at
shutdown): a logging call per decision would cost more than the decision.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable

from kvrouter.service.logs import TextFormatter

FLUSH_INTERVAL_S = 0.05
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


_JSON_LINE = (
    '{"ts":%.6f,"level":"info","logger":"kvrouter.decisions","msg":"routed",'
    '"request_id":%s,"decode_worker":%d,"prefill_worker":%s,"blocks":%d,"overlap":%d,'
    '"ttft_ms":%s,"reason":%s,"us":%s}'
)
_string = json.encoder.encode_basestring_ascii


def _number(value: float) -> str:
    return repr(value) if math.isfinite(value) else "null"


class DecisionLog:
    def __init__(self, enabled: bool) -> None:
        self.logger = logging.getLogger("kvrouter.decisions")
        self.enabled = enabled and self.logger.isEnabledFor(logging.INFO)
        self._take: Callable[[], list[tuple]] = list

    def read_from(self, take: Callable[[], list[tuple]]) -> None:
        """`take()` returns the records made since its last call, each the
        time and the values in FIELDS order."""
        self._take = take

    def flush(self) -> None:
        pending = self._take()
        if not pending:
            return
        for handler in logging.getLogger("kvrouter").handlers:
            text = isinstance(handler.formatter, TextFormatter)
            lines = [self._format(ts, values, text) for ts, *values in pending]
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
        request_id, decode, prefill, blocks, overlap, ttft_ms, reason, us = values
        # The fixed shape is spelled out: json.dumps of a dict per line costs
        # several times more, and only the strings need escaping.
        return _JSON_LINE % (
            ts,
            _string(request_id),
            decode,
            "null" if prefill is None else prefill,
            blocks,
            overlap,
            _number(ttft_ms),
            _string(reason),
            _number(us),
        )

    async def run(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            self.flush()
