"""The router under load, all at once: many concurrent RouteStream clients,
a stream of KV events, and workers joining and leaving. Prints a table and
writes bench/results/load_bench.json.

The router is its own `kvrouter serve` process, with its defaults and an
index bound (`--max-index-blocks`). The load comes from processes of their
own (bench/load_driver.py, grpc.aio on uvloop), so that no one event loop
limits it:

  * `--client-procs` processes sharing `--streams` RouteStream calls, each a
    closed loop of one request at a time (a 64-block prompt), each finished
    with a lifecycle report;
  * one process for the `--workers` workers: heartbeats, `--events-per-s`
    stored blocks per second as batches of 64 blocks on one Publish stream
    per worker, and every `--churn-s` one worker deregistering and a new one
    registering and publishing; and `--big-batch-workers` more that publish
    batches of `--big-batch-events` events (stored, then removed) back to
    back, the biggest the router takes.

Every second this process samples the router's RSS and CPU, the driver's
CPU, what the driver sent and had acknowledged, and what the router applied
and holds (scraped from its /metrics). Reported: errors (any non-OK answer,
with the first one's details per kind), p50/p99 latency per request, events
sent and applied per second, the router's RSS when the index reached its
bound and after, and the CPU seconds each side used.

    .venv/bin/python bench/load_bench.py --duration 30          # the full target
    .venv/bin/python bench/load_bench.py --streams 1000 --events-per-s 50000 \\
        --max-index-blocks 200000 --duration 120
    .venv/bin/python bench/load_bench.py --streams 200 --workers 4 \\
        --events-per-s 20000 --big-batch-workers 2 --duration 30  # maximal batches
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from array import array
from pathlib import Path

import psutil
from load_driver import (
    ACKED,
    BATCH_BLOCKS,
    JOINED,
    REQUESTS,
    SENT,
    clients_process,
    workers_process,
)
from prometheus_client.parser import text_string_to_metric_families

RESULTS = Path(__file__).resolve().parent / "results" / "load_bench.json"
# Share of the bound above which the index counts as full: crossing the
# bound prunes the least recently used tenth, so a full index moves between
# 90% and 100% of it.
FULL = 0.9


def start_router(log_path: Path, max_index_blocks: int) -> tuple[subprocess.Popen, int, int]:
    """The router process, its gRPC port and its metrics port."""
    log = open(log_path, "w")  # noqa: SIM115 - the child process writes it
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "kvrouter.cli", "serve",
            "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
            "--max-index-blocks", str(max_index_blocks),
        ],
        stderr=log,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in log_path.read_text().splitlines():
            record = json.loads(line)
            if record["msg"] == "router serving":
                return proc, record["port"], record["metrics_port"]
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the router did not start; see {log_path}")


def scrape(metrics_port: int) -> dict[tuple, float]:
    """The router's metric samples by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def cpu_s(procs: list[psutil.Process]) -> float:
    return sum(t.user + t.system for t in (p.cpu_times() for p in procs))


class Snapshot:
    """Cumulative figures at one moment."""

    def __init__(self, router, driver, client_counts, worker_counts, metrics_port) -> None:
        self.t = time.monotonic()
        self.rss_mb = router.memory_info().rss / 2**20
        self.router_cpu_s = cpu_s([router])
        self.driver_cpu_s = cpu_s(driver)
        machine = psutil.cpu_times()
        self.machine_busy_s = sum(machine) - machine.idle - machine.iowait
        self.requests = sum(counts[REQUESTS] for counts in client_counts)
        self.sent = worker_counts[SENT]
        self.acked = worker_counts[ACKED]
        metrics = scrape(metrics_port)
        self.batches = {
            dict(labels)["outcome"]: v
            for (name, labels), v in metrics.items()
            if name == "kvrouter_event_batches_total"
        }
        self.applied = BATCH_BLOCKS * self.batches.get("applied", 0)
        self.index_blocks = metrics[("kvrouter_index_blocks", ())]
        self.lag_s = metrics.get(("kvrouter_event_lag_seconds_sum", ()), 0)
        self.lagged = metrics.get(("kvrouter_event_lag_seconds_count", ()), 0)

    def since(self, before: Snapshot, started: float) -> dict:
        dt = self.t - before.t
        lagged = self.lagged - before.lagged
        lag_ms = 1e3 * (self.lag_s - before.lag_s) / lagged if lagged else None
        return {
            "t_s": round(self.t - started, 1),
            "rss_mb": round(self.rss_mb, 1),
            "index_blocks": int(self.index_blocks),
            "routes_per_s": round((self.requests - before.requests) / dt),
            "events_sent_per_s": round((self.sent - before.sent) / dt),
            "events_acked_per_s": round((self.acked - before.acked) / dt),
            "events_applied_per_s": round((self.applied - before.applied) / dt),
            "event_lag_ms": lag_ms and round(lag_ms, 1),
            "router_cpu": round((self.router_cpu_s - before.router_cpu_s) / dt, 2),
            "driver_cpu": round((self.driver_cpu_s - before.driver_cpu_s) / dt, 2),
        }


def rss_slope(samples: list[dict]) -> float | None:
    """Least-squares growth of the router's RSS, MB per minute."""
    if len(samples) < 2:
        return None
    fit = statistics.linear_regression([s["t_s"] for s in samples], [s["rss_mb"] for s in samples])
    return round(60 * fit.slope, 1)


def memory_after_bound(samples: list[dict], bound: int) -> dict:
    """RSS when the index first reached its bound and at the end, and its
    growth in between and over the run's last half."""
    full = [s for s in samples if s["index_blocks"] >= FULL * bound]
    if not full:
        return {"bound_reached_at_s": None}
    after = samples[samples.index(full[0]) :]
    return {
        "bound_reached_at_s": after[0]["t_s"],
        "rss_mb_at_bound": after[0]["rss_mb"],
        "rss_mb_max_after_bound": max(s["rss_mb"] for s in after),
        "rss_mb_at_end": after[-1]["rss_mb"],
        "rss_mb_per_min_after_bound": rss_slope(after),
        "rss_mb_per_min_last_half": rss_slope(samples[len(samples) // 2 :]),
    }


def merge_errors(parts: list[dict]) -> tuple[dict, dict]:
    counts: dict[str, int] = {}
    details: dict[str, str] = {}
    for part in parts:
        for what, n in part["errors"].items():
            counts[what] = counts.get(what, 0) + n
            details.setdefault(what, part["error_details"][what])
    return counts, details


def run(args, router: subprocess.Popen, port: int, metrics_port: int) -> dict:
    ctx = mp.get_context("spawn")
    target = f"127.0.0.1:{port}"
    results = ctx.Queue()
    start = ctx.Barrier(args.client_procs + 2)
    stop = ctx.Event()
    client_counts = [ctx.RawArray("q", 1) for _ in range(args.client_procs)]
    worker_counts = ctx.RawArray("q", 3)
    procs = [
        ctx.Process(
            target=workers_process,
            args=(
                results,
                target,
                args.workers,
                args.events_per_s,
                args.churn_s,
                args.big_batch_workers,
                args.big_batch_events,
                worker_counts,
                start,
                stop,
            ),
        ),
        *(
            ctx.Process(
                target=clients_process,
                args=(results, target, first, streams, counts, start, stop),
            )
            for first, streams, counts in zip(
                range(0, args.streams, -(-args.streams // args.client_procs)),
                split(args.streams, args.client_procs),
                client_counts,
                strict=True,
            )
        ),
    ]
    for proc in procs:
        proc.start()
    start.wait(timeout=120)
    router_ps = psutil.Process(router.pid)
    driver_ps = [psutil.Process(), *(psutil.Process(p.pid) for p in procs)]

    def snapshot() -> Snapshot:
        return Snapshot(router_ps, driver_ps, client_counts, worker_counts, metrics_port)

    first = last = snapshot()
    samples = []
    while last.t - first.t < args.duration - 0.5:
        time.sleep(max(0.0, first.t + len(samples) + 1 - time.monotonic()))
        now = snapshot()
        samples.append(now.since(last, first.t))
        last = now
        print(samples[-1], flush=True)
    stop.set()
    parts = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(30)
    (workers,) = [part for kind, part in parts if kind == "workers"]
    clients = [part for kind, part in parts if kind == "clients"]
    errors, error_details = merge_errors([workers, *clients])
    steady = samples[len(samples) // 2 :]
    elapsed = last.t - first.t

    def steady_mean(key: str) -> float:
        return round(sum(s[key] for s in steady) / max(1, len(steady)))

    return {
        "streams": args.streams,
        "client_procs": args.client_procs,
        "target_events_per_s": args.events_per_s,
        "workers": args.workers,
        "churn_s": args.churn_s,
        "workers_joined": worker_counts[JOINED],
        "max_index_blocks": args.max_index_blocks,
        "duration_s": round(elapsed, 1),
        "requests": last.requests - first.requests,
        "errors": errors,
        "error_details": error_details,
        "router_event_batches": {
            outcome: n - first.batches.get(outcome, 0) for outcome, n in last.batches.items()
        },
        "finished_after_worker_left": sum(p["finished_after_worker_left"] for p in clients),
        "latency_ms": {
            kind: percentiles([part["latencies"][kind] for part in clients])
            for kind in ("route", "first_route", "report")
        },
        "big_batch_workers": args.big_batch_workers,
        "big_batch_events": args.big_batch_events,
        "big_batches": len(workers["big_batch_apply_s"]),
        "big_batch_ack_ms": percentiles([array("d", workers["big_batch_apply_s"])]),
        "routes_per_s": round((last.requests - first.requests) / elapsed),
        "events_sent_per_s": round((last.sent - first.sent) / elapsed),
        "events_applied_per_s": round((last.applied - first.applied) / elapsed),
        "steady_routes_per_s": steady_mean("routes_per_s"),
        "steady_events_sent_per_s": steady_mean("events_sent_per_s"),
        "steady_events_applied_per_s": steady_mean("events_applied_per_s"),
        "rss_mb_start": round(first.rss_mb, 1),
        "rss_mb_max": max(s["rss_mb"] for s in samples),
        "memory": memory_after_bound(samples, args.max_index_blocks),
        "cpu_s": {
            "router": round(last.router_cpu_s - first.router_cpu_s, 1),
            "driver": round(last.driver_cpu_s - first.driver_cpu_s, 1),
            "machine_busy": round(last.machine_busy_s - first.machine_busy_s, 1),
            "available": round(elapsed * psutil.cpu_count(), 1),
        },
        "driver_loop_lag": {
            "workers": workers["loop_lag"],
            "clients": [p["loop_lag"] for p in clients],
        },
        "samples": samples,
    }


def percentiles(parts: list[array]) -> dict:
    """p50 and p99 in ms of the seconds in `parts`."""
    seconds = sorted(itertools.chain(*parts))
    if not seconds:
        return {}
    return {
        "n": len(seconds),
        "p50": round(1e3 * seconds[len(seconds) // 2], 1),
        "p99": round(1e3 * seconds[int(len(seconds) * 0.99)], 1),
    }


def split(n: int, parts: int) -> list[int]:
    """n as `parts` near-equal shares, largest first."""
    share = -(-n // parts)
    return [min(share, n - i * share) for i in range(parts)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=5000)
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--events-per-s", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--churn-s", type=float, default=2.0, help="one worker leaves and joins")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--max-index-blocks", type=int, default=500_000)
    parser.add_argument(
        "--big-batch-workers",
        type=int,
        default=0,
        help="extra workers publishing maximal batches back to back",
    )
    parser.add_argument("--big-batch-events", type=int, default=40_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        router, port, metrics_port = start_router(Path(tmp) / "router.log", args.max_index_blocks)
        try:
            result = run(args, router, port, metrics_port)
        finally:
            router.terminate()
            router.wait(30)
    m = result["memory"]
    print(
        f"streams {result['streams']}  requests {result['requests']}  errors {result['errors']}  "
        f"latency ms {result['latency_ms']}  "
        f"routes/s {result['routes_per_s']}  events/s {args.events_per_s} -> sent "
        f"{result['events_sent_per_s']} -> applied {result['events_applied_per_s']}  "
        f"RSS MB {result['rss_mb_start']} -> {m.get('rss_mb_at_bound')} at bound "
        f"({m.get('bound_reached_at_s')} s) -> {m.get('rss_mb_at_end')}, "
        f"MB/min after {m.get('rss_mb_per_min_after_bound')}, "
        f"in the last half {m.get('rss_mb_per_min_last_half')}  CPU s {result['cpu_s']}"
    )
    if args.big_batch_workers:
        print(
            f"{args.big_batch_workers} workers publishing {args.big_batch_events}-event batches: "
            f"{result['big_batches']} batches, send-to-ack ms {result['big_batch_ack_ms']}"
        )
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
