"""The faults of bench/chaos_soak.py, one at a time at random intervals
from a seeded RNG: the router drained (SIGTERM) or killed (SIGKILL) and
started again on its port with its snapshot path, a worker killed and
started again, a worker paused (SIGSTOP, then SIGCONT), and an event batch
dropped or duplicated on its way (`chaos_proxy`).

A router killed leaves the snapshot its last drain wrote, if any: the
restarted one starts from an index older than its workers' streams."""

from __future__ import annotations

import random
import signal
import time
from collections import Counter

from chaos_proxy import EventFaultProxy

from kvrouter.demo.cluster import LocalCluster

# Relative weights of the faults.
WEIGHTS = {
    "router_sigterm": 1.0,
    "router_sigkill": 1.0,
    "worker_sigkill": 1.5,
    "worker_pause": 1.5,
    "batch_dropped": 2.0,
    "batch_duplicated": 2.0,
}
# Seconds between faults, and a pause's length: some outlast the router's
# heartbeat TTL (5 s), so the worker lapses and joins again.
GAP_S = (4.0, 14.0)
PAUSE_S = (2.0, 8.0)


class Faults:
    def __init__(self, cluster: LocalCluster, proxy: EventFaultProxy, seed: int) -> None:
        self.cluster = cluster
        self.proxy = proxy
        self.rng = random.Random(seed)
        self.injected: Counter[str] = Counter()
        # Router start times (monotonic), the first included.
        self.router_starts = [time.monotonic()]
        # Per router restart: seconds from the signal to the router's exit,
        # and to the new one answering.
        self.router_exit_s: list[float] = []
        self.router_down_s: list[float] = []
        # (start, end, fault) of each fault, monotonic.
        self.timeline: list[tuple[float, float, str]] = []
        # Processes found exited that no fault had stopped.
        self.unexpected_exits: Counter[str] = Counter()

    def next_gap(self) -> float:
        return self.rng.uniform(*GAP_S)

    def inject_one(self) -> str:
        """Injects a fault drawn at random; returns its name."""
        self._revive()
        names = list(WEIGHTS)
        fault = self.rng.choices(names, weights=[WEIGHTS[n] for n in names])[0]
        started = time.monotonic()
        getattr(self, fault)()
        self.timeline.append((started, time.monotonic(), fault))
        self.injected[fault] += 1
        return fault

    def blame(self, failures: list[tuple[float, str]], after_s: float) -> dict[str, Counter]:
        """Failed calls by the fault under way, or ended less than `after_s`
        before (the latest such fault); "none" for the others."""
        blamed: dict[str, Counter] = {}
        for at, what in failures:
            fault = "none"
            for started, ended, name in self.timeline:
                if started <= at <= ended + after_s:
                    fault = name
            blamed.setdefault(fault, Counter())[what] += 1
        return blamed

    def _revive(self) -> None:
        """Restarts what exited on its own, counting it."""
        if self.cluster.router.poll() is not None:
            self.unexpected_exits["router"] += 1
            self._restart_router()
        for worker_id, process in self.cluster.workers.items():
            if process.poll() is not None:
                self.unexpected_exits[f"worker {worker_id}"] += 1
                self.cluster.start_worker(worker_id)

    def _restart_router(self) -> None:
        self.cluster.restart_router()
        self.router_starts.append(time.monotonic())

    def _stop_router(self, sig: signal.Signals) -> None:
        signalled = time.monotonic()
        self.cluster.router.send_signal(sig)
        self.cluster.router.wait(60)
        self.router_exit_s.append(round(time.monotonic() - signalled, 2))
        self._restart_router()
        self.router_down_s.append(round(time.monotonic() - signalled, 2))

    def router_sigterm(self) -> None:
        self._stop_router(signal.SIGTERM)

    def router_sigkill(self) -> None:
        self._stop_router(signal.SIGKILL)

    def _worker(self) -> int:
        return self.rng.choice(sorted(self.cluster.workers))

    def worker_sigkill(self) -> None:
        worker_id = self._worker()
        self.cluster.kill_worker(worker_id)
        self.cluster.start_worker(worker_id)

    def worker_pause(self) -> None:
        process = self.cluster.workers[self._worker()]
        process.send_signal(signal.SIGSTOP)
        time.sleep(self.rng.uniform(*PAUSE_S))
        process.send_signal(signal.SIGCONT)

    def _batch_fault(self, fault: str) -> None:
        # A worker whose stream is down now gets it on its next stream.
        publishing = self.proxy.publishing() or sorted(self.cluster.workers)
        self.proxy.arm(self.rng.choice(publishing), fault)

    def batch_dropped(self) -> None:
        self._batch_fault("drop")

    def batch_duplicated(self) -> None:
        self._batch_fault("duplicate")
