"""The decision log: one line per routing decision, keyed by request id, in
the same shape as the other structured logs (logger "kvrouter.decisions").

The Rust core keeps a record of each decision as it makes it and writes them
out as JSON lines on request; every `FLUSH_INTERVAL_S` (and at shutdown)
they are written in one go. A logging call per decision, or formatting the
lines in Python, would stall the event loop long enough to show in the
routing latency's tail.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

from kvrouter.net.logs import TextFormatter

FLUSH_INTERVAL_S = 0.05
TEXT_FIELDS = (
    "request_id",
    "decode_worker",
    "prefill_worker",
    "blocks",
    "overlap",
    "ttft_ms",
    "reason",
    "us",
)


def text_line(json_line: str) -> str:
    """A JSON decision line as the text log format shows it."""
    record = json.loads(json_line)
    stamp = time.strftime("%H:%M:%S", time.localtime(record["ts"]))
    fields = " ".join(f"{k}={record[k]}" for k in TEXT_FIELDS)
    return f"{stamp} I kvrouter.decisions: routed {fields}\n"


def wanted(configured: bool) -> bool:
    """Whether decisions should be recorded: configured, and the log level
    lets the records through."""
    return configured and logging.getLogger("kvrouter.decisions").isEnabledFor(logging.INFO)


class DecisionLog:
    def __init__(self) -> None:
        self._take: Callable[[], str] = str

    def read_from(self, take: Callable[[], str]) -> None:
        """`take()` returns the JSON lines of the decisions made since its
        last call, each ending in a newline."""
        self._take = take

    def flush(self) -> None:
        lines = self._take()
        if not lines:
            return
        for handler in logging.getLogger("kvrouter").handlers:
            stream = getattr(handler, "stream", None)
            if stream is None:
                continue
            if isinstance(handler.formatter, TextFormatter):
                text = "".join(map(text_line, lines.splitlines()))
            else:
                text = lines
            with handler.lock:
                stream.write(text)
                stream.flush()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            self.flush()
