"""Checks a `pip install kvrouter` with no extras: every subcommand's --help
works, `kvrouter serve` starts and answers a gRPC health check, and a
subcommand that needs an extra names it instead of failing with a traceback.

Run with the bare environment's Python (scripts/check_bare_install.sh)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvrouter.demo.cluster import free_port

KVROUTER = str(Path(sys.executable).with_name("kvrouter"))
SUBCOMMANDS = ("bridge", "demo", "replay", "serve", "sidecar", "worker")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([KVROUTER, *args], capture_output=True, text=True, timeout=60)


def check(ok: bool, what: str, result: subprocess.CompletedProcess | None = None) -> None:
    if not ok:
        detail = f"\n{result.stdout}{result.stderr}" if result is not None else ""
        sys.exit(f"bare install: {what}{detail}")


def serve_and_probe() -> None:
    port = free_port()
    router = subprocess.Popen(
        [KVROUTER, "serve", "--listen", f"127.0.0.1:{port}", "--metrics-listen", ""],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            status = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
        check(status.status == health_pb2.HealthCheckResponse.SERVING, "router not SERVING")
    finally:
        router.send_signal(signal.SIGTERM)
        code = router.wait(timeout=30)
    check(code == 0, f"kvrouter serve exited {code}: {router.stderr.read()}")


def main() -> None:
    result = run("--version")
    check(result.returncode == 0 and result.stdout.startswith("kvrouter "), "--version", result)
    for command in SUBCOMMANDS:
        result = run(command, "--help")
        check(result.returncode == 0, f"kvrouter {command} --help", result)
    serve_and_probe()
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"kvrouter-bare-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        result = run("replay", "--synthetic", "5", "--no-progress")
        check(result.returncode == 2 and "pip install 'kvrouter[replay]'" in result.stderr,
              "replay without numpy names the extra", result)  # fmt: skip
        result = run("worker", "--model", str(workdir))
        check(result.returncode == 2 and "pip install 'kvrouter[engine]'" in result.stderr,
              "worker without torch names the extra", result)  # fmt: skip
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"bare install: ok ({time.process_time():.1f} s CPU)")


if __name__ == "__main__":
    main()
