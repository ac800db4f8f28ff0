"""A `kvrouter worker` started before its router waits for it, retrying
with backoff and logging that it waits, then joins once the router is up:
no exit, no traceback (under Kubernetes, an exit is a crash loop)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from serve_process import ServeProcess
from waiting import wait_until

from kvrouter.client import RouterClient
from kvrouter.demo.cluster import free_port
from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"), "llama", seed=7)


def test_a_worker_started_first_waits_for_its_router(tiny_model, tmp_path):
    target = f"127.0.0.1:{free_port()}"
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvrouter.cli",
                "worker",
                "--model",
                str(tiny_model),
                "--router",
                target,
                "--role",
                "both",
                "--num-kv-blocks",
                "64",
                "--log-format",
                "text",
            ],  # fmt: skip
            stdout=out,
            stderr=out,
        )
    router = None
    try:
        wait_until(
            lambda: worker.poll() is not None or "waiting for the router" in log.read_text(),
            what="the worker to wait for its router",
        )
        assert worker.poll() is None, log.read_text()
        router = ServeProcess(listen=target)
        with RouterClient(target) as client:
            wait_until(
                lambda: [w.routable for w in client.list_workers()] == [True],
                what="the worker to join",
            )
        assert worker.poll() is None and "Traceback" not in log.read_text()
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        if router is not None:
            router.terminate()
