"""Chaos soak: real processes on 127.0.0.1 under faults at random intervals,
with clients running throughout.

A `kvrouter serve` router with `--snapshot-path` and `kvrouter worker`
processes (CPU engine, a tiny random-weight Llama; one prefill, one decode,
two of both) joined to it through `chaos_proxy`. Clients (`chaos_clients`):
proxied Generate through the router, and gateways on RouteStream reporting
each decision finished or cancelled. Faults (`chaos_faults`): router drains
and kills with restarts, worker kills with restarts, worker pauses, dropped
and duplicated event batches.

After `--duration` the faults and the clients stop, and for up to
`--settle` seconds the soak waits for the router's index to hold, per
worker, the blocks the worker's own Status says it caches, and for every
worker to be idle (no request, lease or block in use). Prints a table and
writes bench/results/chaos_soak.json. Exits 1 if a call hung, if the index
did not come level with the workers, or if a worker still pins blocks.

    .venv/bin/python bench/chaos_soak.py [--duration 600] [--settle 90] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
from chaos_clients import Gateway, Tally, generate_loop
from chaos_faults import Faults
from chaos_proxy import EventFaultProxy

from kvrouter.client import RouterError
from kvrouter.demo.cluster import LocalCluster
from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from disagg.helpers import worker_status  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "chaos_soak.json"
ROLES = ["prefill", "decode", "both", "both"]
GENERATE_CLIENTS = 3
GATEWAYS = 2
RSS_EVERY_S = 2.0
# RSS samples of the first this many seconds are warm-up, and the last may
# exceed the median of the rest by this share and still count as flat.
WARM_UP_S = 60.0
FLAT_MARGIN = 0.10
# A failed call is put down to a fault under way or ended this recently: a
# heartbeat TTL (5 s) and a client's reconnect backoff.
BLAME_AFTER_S = 10.0


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


async def sample_rss(cluster: LocalCluster, started: float, samples: list, stop) -> None:
    while not stop.is_set():
        mb = rss_mb(cluster.router.pid)
        if mb is not None:
            samples.append((round(time.monotonic() - started, 1), cluster.router.pid, mb))
        await asyncio.sleep(RSS_EVERY_S)


async def inject_faults(faults: Faults, until: float, log: list) -> None:
    while time.monotonic() + (gap := faults.next_gap()) < until:
        await asyncio.sleep(gap)
        try:
            fault = await asyncio.to_thread(faults.inject_one)
        except Exception as e:  # a fault that could not be completed is reported, not fatal
            log.append(f"fault failed: {e!r}")
            print(f"  fault failed: {e!r}", file=sys.stderr)
        else:
            print(f"  {time.strftime('%H:%M:%S')} {fault}", file=sys.stderr)


def worker_table(cluster: LocalCluster) -> dict[int, dict] | None:
    """Per worker: what the index holds and what the worker's Status says;
    None while the router does not answer."""
    try:
        infos = {w.worker_id: w for w in cluster.list_workers()}
    except (RouterError, grpc.RpcError):
        return None
    table = {}
    for worker_id, process in sorted(cluster.workers.items()):
        info = infos.get(worker_id)
        row = {"registered": info is not None, "alive": process.poll() is None}
        if info is not None:
            row.update(routable=info.routable, index_blocks=info.index_blocks)
            try:
                s = worker_status(info.address)
            except grpc.RpcError as e:
                row["status_error"] = e.code().name
            else:
                row.update(
                    cached_blocks=s.cached_blocks,
                    leased_blocks=s.leased_blocks,
                    leases=s.leases,
                    blocks_in_use=s.blocks_in_use,
                    requests=s.running_requests + s.waiting_requests,
                )
        table[worker_id] = row
    return table


def level(row: dict) -> bool:
    return row.get("routable", False) and row.get("index_blocks") == row.get("cached_blocks")


def idle(row: dict) -> bool:
    return "cached_blocks" in row and not (row["blocks_in_use"] or row["leases"] or row["requests"])


def settle(cluster: LocalCluster, settle_s: float) -> tuple[dict | None, float | None]:
    """Waits for every worker to be level and idle; returns the last table
    and the seconds it took (None if it never came)."""
    started = time.monotonic()
    table = None
    while time.monotonic() - started < settle_s:
        table = worker_table(cluster)
        if table and all(level(r) and idle(r) for r in table.values()):
            return table, round(time.monotonic() - started, 1)
        time.sleep(1.0)
    return table, None


def rss_summary(samples: list) -> dict:
    if not samples:
        return {}
    after = [mb for t, _, mb in samples if t >= WARM_UP_S] or [mb for _, _, mb in samples]
    median = statistics.median(after)
    lives: dict[int, list[float]] = {}
    for _, pid, mb in samples:
        lives.setdefault(pid, []).append(mb)
    return {
        "samples": len(samples),
        "first_mb": round(samples[0][2], 1),
        "median_mb": round(median, 1),
        "last_mb": round(samples[-1][2], 1),
        "max_mb": round(max(mb for _, _, mb in samples), 1),
        "flat": samples[-1][2] <= median * (1 + FLAT_MARGIN),
        "max_per_router_life_mb": [round(max(v), 1) for v in lives.values()],
    }


def longest_life_s(starts: list[float], ended: float) -> float:
    ends = [*starts[1:], ended]
    return round(max(e - s for s, e in zip(starts, ends, strict=True)), 1)


async def soak(cluster: LocalCluster, faults: Faults, args) -> dict:
    tally = Tally()
    stop = asyncio.Event()
    started = time.monotonic()
    samples: list = []
    fault_log: list[str] = []
    clients = [
        asyncio.create_task(generate_loop(cluster.target, args.seed * 100 + i, tally, stop))
        for i in range(GENERATE_CLIENTS)
    ]
    gateways = [Gateway(cluster.target, args.seed * 100 + 50 + i, tally) for i in range(GATEWAYS)]
    clients += [asyncio.create_task(g.run(stop)) for g in gateways]
    sampler = asyncio.create_task(sample_rss(cluster, started, samples, stop))
    await inject_faults(faults, started + args.duration, fault_log)
    await asyncio.sleep(max(0.0, started + args.duration - time.monotonic()))
    faults.proxy.disarm()
    stop.set()
    await asyncio.gather(*clients, sampler)
    soak_s = time.monotonic() - started
    table, converged_s = await asyncio.to_thread(settle, cluster, args.settle)
    return {
        "tally": tally,
        "rss": samples,
        "fault_log": fault_log,
        "table": table,
        "converged_s": converged_s,
        "longest_router_life_s": longest_life_s(faults.router_starts, started + soak_s),
    }


def report(run: dict, faults: Faults, proxy: EventFaultProxy, args, load: dict) -> dict:
    tally: Tally = run["tally"]
    table = run["table"] or {}
    generate = {
        k.split(" ", 1)[1]: n for k, n in tally.outcomes.items() if k.startswith("generate")
    }
    injected = dict(faults.injected)
    injected["batch_dropped_applied"] = proxy.done["drop"]
    injected["batch_duplicated_applied"] = proxy.done["duplicate"]
    return {
        "command": " ".join(["bench/chaos_soak.py", *sys.argv[1:]]),
        "seed": args.seed,
        "duration_s": args.duration,
        "settle_s": args.settle,
        "roles": ROLES,
        "clients": {"generate": GENERATE_CLIENTS, "route_stream_gateways": GATEWAYS},
        "load_average": load,
        "calls_total": sum(tally.calls.values()),
        "calls": dict(tally.calls),
        "outcomes": dict(sorted(tally.outcomes.items())),
        "error_messages": {k: dict(v.most_common(5)) for k, v in sorted(tally.messages.items())},
        "hung": tally.hung,
        "generate": {
            "ok": generate.get("ok", 0),
            "failed_over": generate.get("failed over", 0),
            "failed": sum(n for k, n in generate.items() if k not in ("ok", "failed over")),
        },
        "faults": injected,
        "failures_by_fault": {
            k: dict(v) for k, v in faults.blame(tally.failures, BLAME_AFTER_S).items()
        },
        "fault_errors": run["fault_log"],
        "router_restarts": len(faults.router_starts) - 1,
        "router_exit_s": faults.router_exit_s,
        "router_down_s": faults.router_down_s,
        "longest_router_life_s": run["longest_router_life_s"],
        "unexpected_exits": dict(faults.unexpected_exits),
        "index_level_with_workers": bool(table) and all(level(r) for r in table.values()),
        "converged_after_s": run["converged_s"],
        "workers": table,
        "pinned_blocks": sum(r.get("leased_blocks", 0) for r in table.values()),
        "blocks_in_use": sum(r.get("blocks_in_use", 0) for r in table.values()),
        "router_rss": rss_summary(run["rss"]),
    }


def print_table(result: dict) -> None:
    rows = [
        ("calls total", result["calls_total"]),
        ("hung calls", result["hung"]),
        (
            "generate ok / failed over / failed",
            "{ok} / {failed_over} / {failed}".format(**result["generate"]),
        ),
        *((f"  {k}", n) for k, n in result["outcomes"].items()),
        *((f"fault {k}", n) for k, n in result["faults"].items()),
        *(
            (f"failed calls during/after {k}", sum(v.values()))
            for k, v in result["failures_by_fault"].items()
        ),
        ("router restarts", result["router_restarts"]),
        ("longest router life (s)", result["longest_router_life_s"]),
        ("router signal to exit, max (s)", max(result["router_exit_s"], default=None)),
        ("router signal to serving again, max (s)", max(result["router_down_s"], default=None)),
        ("unexpected exits", result["unexpected_exits"] or "none"),
        ("index level with workers' Status", result["index_level_with_workers"]),
        ("converged after (s)", result["converged_after_s"]),
        ("pinned blocks left", result["pinned_blocks"]),
        ("blocks in use left", result["blocks_in_use"]),
    ]
    for worker_id, row in (result["workers"] or {}).items():
        rows.append(
            (
                f"worker {worker_id}: index / cached blocks",
                "{} / {}".format(row.get("index_blocks"), row.get("cached_blocks")),
            )
        )
    rss = result["router_rss"]
    rows.append(
        (
            "router RSS first/median/last/max (MB)",
            "{first_mb} / {median_mb} / {last_mb} / {max_mb}, flat: {flat}".format(**rss)
            if rss
            else "none",
        )
    )
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def failures(result: dict) -> list[str]:
    found = []
    if result["hung"]:
        found.append(f"{result['hung']} calls hung")
    if not result["index_level_with_workers"]:
        found.append("the index is not level with the workers' Status")
    if result["pinned_blocks"] or result["blocks_in_use"]:
        found.append("workers still hold blocks")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of faults")
    parser.add_argument("--settle", type=float, default=90.0, help="seconds to converge after")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-dir", default="", help="keep the processes' logs here")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="kvrouter-chaos-"))
    log_dir = Path(args.log_dir or tmp / "logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    model = write_tiny_checkpoint(tmp / "tiny-llama", "llama", seed=args.seed)
    # The workers join through the proxy; it finds the router wherever it is.
    proxy = EventFaultProxy(lambda: cluster.target)
    cluster = LocalCluster(
        model,
        ROLES,
        # Prompts longer than this are split between a prefill and a decode worker.
        router_env={"KVROUTER_POLICY_LOCAL_PREFILL_MAX_TOKENS": "64"},
        router_args=["--snapshot-path", str(tmp / "index.snapshot")],
        # A small cache, so that blocks are evicted as well as stored.
        worker_args=["--num-kv-blocks", "160"],
        log_dir=log_dir,
        worker_router=proxy.target,
    )
    load = {"start": os.getloadavg()}
    print(
        f"chaos soak: {args.duration:.0f} s, seed {args.seed}, logs in {log_dir}", file=sys.stderr
    )
    with cluster:
        faults = Faults(cluster, proxy, args.seed)
        run = asyncio.run(soak(cluster, faults, args))
        load["end"] = os.getloadavg()
        result = report(run, faults, proxy, args, load)
    proxy.close()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    found = failures(result)
    for failure in found:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
