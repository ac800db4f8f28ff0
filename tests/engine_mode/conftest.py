"""`kvrouter worker` in its engine-compatible mode, started for real as a
process on 127.0.0.1 (free ports), and a plain engine as the reference."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from dataclasses import dataclass, field

import pytest

pytest.importorskip("zmq", reason="the adapters extra (pyzmq) is not installed")
pytest.importorskip("uvicorn", reason="the frontend extra (uvicorn) is not installed")

from greedy_reference import greedy_reference, greedy_scored  # noqa: E402

from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint  # noqa: E402

MODEL = "tiny"
BLOCK_SIZE = 16
NUM_KV_BLOCKS = 256


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"), "llama", seed=5)


@pytest.fixture(scope="session")
def reference(tiny_model):
    return greedy_reference(tiny_model)


@pytest.fixture(scope="session")
def scored(tiny_model):
    return greedy_scored(tiny_model)


@dataclass
class EngineWorker:
    proc: subprocess.Popen
    url: str
    kv_events: str
    kv_replay: str
    # Its gRPC Worker service, where decode workers fetch its hand-offs.
    address: str
    lines: queue.Queue
    seen: list[dict] = field(default_factory=list)

    def logged(self, msg: str) -> list[dict]:
        """The JSON log records with this message, so far."""
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                break
            if line is not None and line.startswith("{"):
                self.seen.append(json.loads(line))
        return [r for r in self.seen if r.get("msg") == msg]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_engine_worker(model, *flags: str) -> EngineWorker:
    """A worker serving vLLM's surface on free ports; returns once it serves."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvrouter.cli",
            "worker",
            "--model",
            str(model),
            "--served-model-name",
            MODEL,
            "--block-size",
            str(BLOCK_SIZE),
            "--num-kv-blocks",
            str(NUM_KV_BLOCKS),
            "--vllm-http-listen",
            "127.0.0.1:0",
            "--vllm-kv-events-endpoint",
            "tcp://127.0.0.1:*",
            "--vllm-kv-events-replay-endpoint",
            "tcp://127.0.0.1:*",
            *flags,
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in proc.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    while (line := lines.get(timeout=120)) is not None:
        record = json.loads(line) if line.startswith("{") else {}
        if record.get("msg") == "worker serving":
            return EngineWorker(
                proc,
                record["http_address"],
                record["kv_events"],
                record["kv_events_replay"],
                record["address"],
                lines,
            )
    raise AssertionError("the worker exited before it served")


@pytest.fixture(scope="module")
def engine_worker(tiny_model):
    worker = start_engine_worker(tiny_model)
    yield worker
    worker.kill()
