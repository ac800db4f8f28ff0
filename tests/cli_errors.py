"""A `kvrouter` subcommand run for real as a process, and the promise every
one makes about a setting it cannot start with: it exits non-zero with one
line on stderr that names the problem and the flag, and no traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


def kvrouter(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvrouter.cli", *args], capture_output=True, text=True, timeout=120
    )


def assert_one_line_naming(result: subprocess.CompletedProcess, *words: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]


@contextmanager
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 another socket listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]
