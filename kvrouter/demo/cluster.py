"""A router and its workers as child processes on 127.0.0.1: what the demo,
the end-to-end tests and the benchmark run against. Each process logs to a
file of its own under `log_dir`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvrouter.client import RouterClient, WorkerInfo

# On Linux each child first asks for SIGTERM when the process that started it
# dies (PR_SET_PDEATHSIG, kept across exec), then becomes the CLI: an
# interrupted test run or demo leaves no server behind. (Done in the child
# itself: a preexec_fn would run gRPC's fork handlers in a forked copy of
# this process, which aborts.)
_EXIT_WITH_PARENT = (
    "import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
    "os.execv(sys.executable, [sys.executable, '-m', 'kvrouter.cli', *sys.argv[1:]])"
)
_LAUNCHER = ["-c", _EXIT_WITH_PARENT] if sys.platform == "linux" else ["-m", "kvrouter.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ClusterError(RuntimeError):
    pass


class LocalCluster:
    """`with LocalCluster(model, roles=["prefill", "decode"]) as cluster:`;
    worker ids are 1, 2, ... in the order of `roles`. `served_models`, one
    per role, names the model each worker serves (default: none named);
    change an entry and restart the worker to move it to another model."""

    def __init__(
        self,
        model: str | Path,
        roles: list[str],
        *,
        policy: str = "kv",
        router_env: dict[str, str] | None = None,
        router_args: list[str] | None = None,
        worker_args: list[str] | None = None,
        served_models: list[str] | None = None,
        log_dir: str | Path | None = None,
        start_timeout_s: float = 120.0,
        worker_router: str = "",
    ) -> None:
        self.model = str(model)
        self.roles = list(roles)
        self.policy = policy
        self.router_env = dict(router_env or {})
        # After the cluster's own flags, so they win.
        self.router_args = list(router_args or [])
        self.worker_args = list(worker_args or [])
        self.served_models = list(served_models or [""] * len(self.roles))
        if len(self.served_models) != len(self.roles):
            raise ValueError("served_models needs one model per role")
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="kvrouter-cluster-"))
        self.start_timeout_s = start_timeout_s
        # Where the workers join: the router itself, or a proxy in front of it.
        self.worker_router = worker_router
        self.target = ""
        self.router: subprocess.Popen | None = None
        self.workers: dict[int, subprocess.Popen] = {}
        # Restarted workers' addresses before the restart: until the new
        # process registers, the router still lists the old one.
        self._replaced: dict[int, str] = {}
        self._client: RouterClient | None = None

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
        # The child keeps its own copy of the file descriptor.
        with open(self.log_dir / f"{name}.log", "ab") as log:
            return subprocess.Popen(
                [sys.executable, *_LAUNCHER, *args],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **env},
            )

    def start(self) -> LocalCluster:
        deadline = self.launch()
        try:
            self.wait_for_workers(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def launch(self) -> float:
        """Starts the router and the workers' processes without waiting for
        the workers (`wait_for_workers`, by the deadline returned), so that
        several clusters can load side by side."""
        deadline = time.monotonic() + self.start_timeout_s
        try:
            self._start_router(deadline)
            for worker_id in range(1, len(self.roles) + 1):
                self.start_worker(worker_id)
        except BaseException:
            self.stop()
            raise
        return deadline

    def _start_router(self, deadline: float) -> None:
        for _ in range(3):  # a port picked as free may be taken before the router binds it
            if self._spawn_router(f"127.0.0.1:{free_port()}", deadline):
                return
            if self.router.poll() is None:
                break
        raise ClusterError(f"the router did not start; see {self.log_dir / 'router.log'}")

    def restart_router(self) -> None:
        """Starts the router again at its address, once the last one has
        exited (a test killed or stopped it); the workers find it there."""
        if not self._spawn_router(self.target, time.monotonic() + self.start_timeout_s):
            raise ClusterError(f"the router did not restart; see {self.log_dir / 'router.log'}")

    def _spawn_router(self, target: str, deadline: float) -> bool:
        """Starts the router at `target`; True once it answers."""
        policy = "kvrouter" if self.policy == "kv" else self.policy
        env = {"KVROUTER_POLICY_POLICY": policy, **self.router_env}
        self.target = target
        args = ["serve", "--listen", target, "--metrics-listen", "", "--log-format"]
        args += ["text", "--log-decisions", "false", *self.router_args]
        if self._client is not None:
            self._client.close()
        self.router = self._spawn("router", args, env)
        self._client = RouterClient(target, timeout=2.0)
        while self.router.poll() is None and time.monotonic() < deadline:
            try:
                self._client.list_workers()
                return True
            except Exception:
                time.sleep(0.1)
        self._client.close()
        self._client = None
        return False

    def start_worker(self, worker_id: int) -> None:
        """Starts (or restarts) worker `worker_id` with its role from `roles`."""
        role = self.roles[worker_id - 1]
        if worker_id in self.workers and self._client is not None:
            listed = {w.worker_id: w.address for w in self._client.list_workers()}
            if worker_id in listed:
                self._replaced[worker_id] = listed[worker_id]
        router = self.worker_router or self.target
        args = ["worker", "--model", self.model, "--router", router, "--role", role]
        args += ["--worker-id", str(worker_id), "--log-format", "text", *self.worker_args]
        if self.served_models[worker_id - 1]:
            args += ["--served-model-name", self.served_models[worker_id - 1]]
        self.workers[worker_id] = self._spawn(self._log_name(worker_id), args, {})

    def _log_name(self, worker_id: int) -> str:
        return f"worker-{worker_id}-{self.roles[worker_id - 1]}"

    def wait_for_workers(self, deadline: float | None = None) -> list[WorkerInfo]:
        """Waits until every running worker is registered and routable, a
        restarted one under its new process."""
        deadline = deadline or time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            for worker_id, process in self.workers.items():
                if process.poll() is not None:
                    log = self.log_dir / f"{self._log_name(worker_id)}.log"
                    tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
                    raise ClusterError(
                        f"worker {worker_id} exited with {process.returncode}; {log} ends:\n{tail}"
                    )
            alive = {w for w, p in self.workers.items() if p.poll() is None}
            try:
                infos = self._client.list_workers()
            except Exception:
                infos = []
            ready = {
                w.worker_id
                for w in infos
                if w.routable and w.address != self._replaced.get(w.worker_id)
            }
            if alive <= ready:
                self._replaced.clear()
                return infos
            time.sleep(0.1)
        raise ClusterError(f"workers did not register in time; see {self.log_dir}")

    def list_workers(self) -> list[WorkerInfo]:
        return self._client.list_workers()

    def address(self, worker_id: int) -> str:
        for info in self.list_workers():
            if info.worker_id == worker_id:
                return info.address
        raise KeyError(f"worker {worker_id} is not registered")

    def kill_worker(self, worker_id: int) -> None:
        """SIGKILL: the worker dies without deregistering, as in a crash."""
        process = self.workers[worker_id]
        process.kill()
        process.wait()

    def stop(self) -> None:
        processes = [p for p in self.workers.values() if p.poll() is None]
        if self.router is not None and self.router.poll() is None:
            processes.append(self.router)
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
