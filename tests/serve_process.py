"""`kvrouter serve` started for real as a process on 127.0.0.1, its JSON log
read line by line: what the tests that start or signal a real router share
(drain, kill, pause, start-up)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading


def serve_command(*flags: str) -> list[str]:
    """The command line of a router with no metrics port."""
    return [sys.executable, "-m", "kvrouter.cli", "serve", "--metrics-listen", "", *flags]


class ServeProcess:
    """A started router: waits for it to log "router serving". `listen` may
    name a fixed port, so that a restarted router is found where its clients
    already look."""

    def __init__(
        self, *flags: str, env: dict[str, str] | None = None, listen: str = "127.0.0.1:0"
    ) -> None:
        self.proc = subprocess.Popen(
            serve_command("--listen", listen, *flags),
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.port = self.wait_for("router serving")["port"]
        self.target = f"127.0.0.1:{self.port}"

    def _pump(self) -> None:
        for line in self.proc.stderr:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, msg: str, timeout: float = 30.0) -> dict:
        for record in self.seen:
            if record["msg"] == msg:
                return record
        while (line := self.lines.get(timeout=timeout)) is not None:
            record = json.loads(line)
            self.seen.append(record)
            if record["msg"] == msg:
                return record
        raise AssertionError(f"the router exited before logging {msg!r}")

    def logged(self, msg: str) -> list[dict]:
        """The records logged so far with this message."""
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.seen.append(json.loads(line))
        return [record for record in self.seen if record["msg"] == msg]

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
