"""`kvrouter demo` end to end (a smaller workload): both deployments come up,
every request completes, the tables print, and it exits 0."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs_and_compares_with_round_robin(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "kvrouter.cli", "demo", "--chats", "2", "--agents", "1"]
        + ["--chat-turns", "3", "--agent-steps", "4"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "turn 1" in out and "turn 4" in out
    assert "kv-aware" in out and "round robin" in out
    assert "same tokens under both policies: 10/10" in out
