"""`kvrouter demo` end to end (a smaller workload, two rounds, without the
burst, which tests/disagg/test_serving.py runs on its deployment): both
deployments come up, every request completes, the tables print, the
figures reach `--json`, and it exits 0."""

from __future__ import annotations

import json
import subprocess
import sys


def test_demo_runs_and_compares_with_round_robin(tmp_path):
    figures = tmp_path / "demo.json"
    done = subprocess.run(
        [sys.executable, "-m", "kvrouter.cli", "demo", "--chats", "2", "--agents", "1"]
        + ["--chat-turns", "3", "--agent-steps", "4", "--rounds", "2", "--no-burst"]
        + ["--json", str(figures)],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "turn 1" in out and "turn 4" in out
    assert "kv-aware" in out and "round robin" in out
    assert "same tokens under both policies: 20/20" in out
    result = json.loads(figures.read_text())
    assert [sorted(r) for r in result["rounds"]] == [["kv", "round_robin"]] * 2
    assert result["burst"] == {}


def test_demo_refuses_zero_rounds():
    done = subprocess.run(
        [sys.executable, "-m", "kvrouter.cli", "demo", "--rounds", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "kvrouter demo: --rounds must be at least 1"
