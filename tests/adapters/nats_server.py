"""A real nats-server with JetStream on a free loopback port."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

INSTALL = "apt-get install -y nats-server"


def find_binary() -> str | None:
    return shutil.which("nats-server") or next(
        (p for p in ("/usr/sbin/nats-server", "/usr/bin/nats-server") if Path(p).exists()), None
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _accepting(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


class NatsServer:
    """`port`: where a stopped one listened, to start it again there."""

    def __init__(self, store_dir: Path, port: int | None = None) -> None:
        binary = find_binary()
        if binary is None:
            pytest.skip(f"nats-server is not installed ({INSTALL})")
        for _ in range(5):
            self.port = port or _free_port()
            self.proc = subprocess.Popen(
                [binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(store_dir)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 15
            while self.proc.poll() is None and time.monotonic() < deadline:
                if _accepting(self.port):
                    return
                time.sleep(0.02)
            self.stop()
        raise RuntimeError("nats-server did not start")

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
