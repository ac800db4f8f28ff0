"""Structured logs: one JSON object per line on stderr.

Fields passed as `extra={"fields": {...}}` become top-level keys, so every
line about a request carries its `request_id` and can be found with grep/jq.
"""

from __future__ import annotations

import json
import logging
import sys
import time

_RESERVED = ("ts", "level", "logger", "msg")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in getattr(record, "fields", {}).items():
            out[key if key not in _RESERVED else f"field_{key}"] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        fields = " ".join(f"{k}={v}" for k, v in getattr(record, "fields", {}).items())
        line = f"{stamp} {record.levelname[0]} {record.name}: {record.getMessage()} {fields}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line.rstrip()


def check_level(level: str) -> None:
    """Raises ValueError unless `level` is a logging level name."""
    if level.upper() not in logging.getLevelNamesMapping():
        raise ValueError(f"--log-level {level!r}: expected debug, info, warning, error or critical")


def configure(level: str = "info", fmt: str = "json") -> None:
    """Points the `kvrouter` loggers at stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("kvrouter")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
