"""Router service benchmark: decisions per second and latency of `kvrouter
serve`, against a trivial grpc.aio echo server carrying the same payloads, in
one run.

The router runs as its own process (the `kvrouter serve` command, default
configuration, decision logs on and written to a file), with 16 registered
workers whose KV events (a cached document of 3/4 of each prompt size per
worker and size) are published before the clock starts. The echo server is a
second process: grpc.aio on uvloop, returning each request's bytes. This
process drives both with the same pre-serialized RouteRequest payloads
(tokens as little-endian u32 bytes; each prompt is a worker's cached document
plus a fresh quarter), so the difference is what routing costs:

  * max load, unary: 64 calls in flight;
  * max load, streaming: one RouteStream with 64 messages in flight;
  * half load: requests paced at half the router's max rate, sent to both
    servers; the router's p99 minus the echo's p99 is the latency it adds
    end to end, and the router's own routing-latency histogram (scraped from
    /metrics before and after) bounds the p99 of the time spent deciding.

Router and echo cells alternate in short rounds, so a neighbour's load on a
shared machine falls on both alike; the servers' CPU time per request is
read from /proc. Requests carry no request id and report no lifecycle: the
router books every decision, as a gateway's would be before it finishes.

    .venv/bin/python bench/service_bench.py           # about 2 minutes on 2 cores
    .venv/bin/python bench/service_bench.py --quick   # smoke run, under a minute
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from array import array
from collections import deque
from functools import partial
from pathlib import Path

import grpc
import uvloop

from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

SIZES = (1_024, 4_096, 32_768, 131_072)
WORKERS = 16
BLOCK = 16
VOCAB = 150_000
IN_FLIGHT = 64
PROMPTS_PER_SIZE = 64
ROUNDS = 8
RESULTS = Path(__file__).resolve().parent / "results" / "service_bench.json"
OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
]
ROUTE_UNARY = "/kvrouter.v1.Router/Route"
ROUTE_STREAM = "/kvrouter.v1.Router/RouteStream"
ECHO_UNARY = "/bench.Echo/Unary"
ECHO_STREAM = "/bench.Echo/Stream"

TARGET_THROUGHPUT_SHARE = 0.80  # of the echo's, at 4k tokens
TARGET_ADDED_P99_MS = 1.0  # at half load
TARGET_128K_PER_S = 1_000


# -- the echo server (a process of its own)
async def echo_server() -> None:
    async def unary(request: bytes, context) -> bytes:
        return request

    async def stream(requests, context):
        async for request in requests:
            yield request

    server = grpc.aio.server(options=OPTIONS)
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "bench.Echo",
                {
                    "Unary": grpc.unary_unary_rpc_method_handler(unary),
                    "Stream": grpc.stream_stream_rpc_method_handler(stream),
                },
            )
        ]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


def start_echo() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--echo-server"], stdout=subprocess.PIPE, text=True
    )
    return proc, f"127.0.0.1:{int(proc.stdout.readline())}"


def start_router(log_path: Path) -> tuple[subprocess.Popen, str, int]:
    log = open(log_path, "w")  # noqa: SIM115 - the child process writes it
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvrouter.cli",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--heartbeat-ttl-s",
            "3600",
        ],
        stderr=log,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in log_path.read_text().splitlines():
            record = json.loads(line)
            if record["msg"] == "router serving":
                return proc, f"127.0.0.1:{record['port']}", record["metrics_port"]
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the router did not start; see {log_path}")


# -- workload
def tokens(rng: random.Random, n: int) -> array:
    return array("I", (rng.randrange(VOCAB) for _ in range(n)))


def documents(rng: random.Random) -> dict[tuple[int, int], array]:
    """Per (size, worker): the cached 3/4 of a prompt, in whole blocks."""
    return {(size, w): tokens(rng, size * 3 // 4) for size in SIZES for w in range(WORKERS)}


def payloads(rng: random.Random, docs, size: int) -> list[bytes]:
    out = []
    for i in range(PROMPTS_PER_SIZE):
        prompt = docs[(size, i % WORKERS)] + tokens(rng, size - size * 3 // 4)
        out.append(pb.RouteRequest(tokens_u32le=prompt.tobytes()).SerializeToString())
    return out


async def preload(target: str, docs) -> None:
    async with grpc.aio.insecure_channel(target, options=OPTIONS) as channel:
        registry = router_pb2_grpc.RegistryStub(channel)
        events = router_pb2_grpc.KvEventsStub(channel)
        for w in range(WORKERS):
            await registry.Register(
                pb.RegisterRequest(
                    worker_id=w,
                    role=pb.ROLE_BOTH,
                    address=f"worker-{w}:7000",
                    block_size=BLOCK,
                    capacity_blocks=1 << 22,
                )
            )
            call = events.Publish()
            await call.write(
                pb.PublishRequest(hello=pb.PublishHello(worker_id=w, next_seq=0, block_size=BLOCK))
            )
            await call.read()
            next_id = 1
            for seq, size in enumerate(SIZES):
                doc = docs[(size, w)]
                n = len(doc) // BLOCK
                stored = pb.StoredEvent(block_ids=range(next_id, next_id + n), token_ids=doc)
                next_id += n
                await call.write(
                    pb.PublishRequest(
                        batch=pb.EventBatch(seq=seq, events=[pb.KvEvent(stored=stored)])
                    )
                )
                reply = await call.read()
                assert reply.ack.next_seq == seq + 1, reply
            await call.done_writing()


# -- load
def summary(latencies: list[float], elapsed: float) -> dict:
    ordered = sorted(latencies)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3  # noqa: E731
    return {
        "requests": len(ordered),
        "seconds": elapsed,
        "per_s": len(ordered) / elapsed,
        "p50_ms": pick(0.50),
        "p99_ms": pick(0.99),
        "latencies": latencies,
    }


async def unary_load(
    channel, method: str, bodies: list[bytes], rate: float | None, seconds: float
) -> dict:
    """Closed loop with IN_FLIGHT callers, or open loop at `rate` per second."""
    call = channel.unary_unary(method)
    latencies: list[float] = []
    end = time.perf_counter() + seconds

    async def one(body: bytes) -> None:
        t0 = time.perf_counter()
        await call(body)
        latencies.append(time.perf_counter() - t0)

    async def caller(k: int) -> None:
        i = k
        while time.perf_counter() < end:
            await one(bodies[i % len(bodies)])
            i += IN_FLIGHT

    start = time.perf_counter()
    if rate is None:
        await asyncio.gather(*(caller(k) for k in range(IN_FLIGHT)))
    else:
        tasks, i = [], 0
        while (now := time.perf_counter()) < end:
            due = start + i / rate
            if due > now:
                await asyncio.sleep(due - now)
            tasks.append(asyncio.ensure_future(one(bodies[i % len(bodies)])))
            i += 1
        await asyncio.gather(*tasks)
    return summary(latencies, time.perf_counter() - start)


async def stream_load(
    channel, method: str, bodies: list[bytes], rate: float | None, seconds: float
) -> dict:
    """One bidirectional stream: up to IN_FLIGHT messages outstanding, or paced."""
    call = channel.stream_stream(method)()
    sent: deque[float] = deque()
    latencies: list[float] = []
    window = asyncio.Semaphore(IN_FLIGHT)
    start = time.perf_counter()
    end = start + seconds

    async def writer() -> None:
        i = 0
        while (now := time.perf_counter()) < end:
            if rate is not None:
                due = start + i / rate
                if due > now:
                    await asyncio.sleep(due - now)
            await window.acquire()
            sent.append(time.perf_counter())
            await call.write(bodies[i % len(bodies)])
            i += 1
        await call.done_writing()

    async def reader() -> None:
        while (reply := await call.read()) is not grpc.aio.EOF:
            latencies.append(time.perf_counter() - sent.popleft())
            window.release()
            del reply

    await asyncio.gather(writer(), reader())
    return summary(latencies, time.perf_counter() - start)


def latency_buckets(metrics_port: int) -> list[tuple[float, float]]:
    """The router's own routing-latency histogram: (upper bound s, count)."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = []
    for line in text.splitlines():
        if line.startswith("kvrouter_routing_latency_seconds_bucket"):
            bound = line.split('le="')[1].split('"')[0]
            out.append((float(bound), float(line.rsplit(" ", 1)[1])))
    return out


def bucket_quantile(before, after, q: float) -> float:
    """Upper bound (ms) of the bucket holding quantile q of the decisions in between."""
    counts = [(bound, a - b) for (bound, a), (_, b) in zip(after, before, strict=True)]
    total = counts[-1][1]
    for bound, count in counts:
        if count >= q * total:
            return bound * 1e3
    return float("inf")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def interleaved(cells, seconds: float) -> list[dict]:
    """Runs each (pid, make_load) cell for `seconds` in all, in ROUNDS turns
    that alternate between cells, so that a neighbour's CPU use on a shared
    machine falls on both sides alike. Adds the server's CPU per request."""
    parts: list[list[dict]] = [[] for _ in cells]
    cpu = [0.0] * len(cells)
    for _ in range(ROUNDS):
        for k, (pid, make_load) in enumerate(cells):
            before = cpu_seconds(pid)
            parts[k].append(await make_load(seconds / ROUNDS))
            cpu[k] += cpu_seconds(pid) - before
    merged = []
    for k, runs in enumerate(parts):
        latencies = [x for run in runs for x in run.pop("latencies")]
        out = summary(latencies, sum(run["seconds"] for run in runs))
        del out["latencies"]
        out["server_cpu_us"] = cpu[k] / max(out["requests"], 1) * 1e6
        merged.append(out)
    return merged


async def measure(
    router: str, metrics_port: int, echo: str, pids: tuple[int, int], sizes, seconds: float
) -> list[dict]:
    rng = random.Random(0)
    docs = documents(rng)
    await preload(router, docs)
    rows = []
    async with (
        grpc.aio.insecure_channel(router, options=OPTIONS) as rch,
        grpc.aio.insecure_channel(echo, options=OPTIONS) as ech,
    ):
        for size in sizes:
            bodies = payloads(rng, docs, size)
            for mode, load, r_method, e_method in (
                ("unary", unary_load, ROUTE_UNARY, ECHO_UNARY),
                ("stream", stream_load, ROUTE_STREAM, ECHO_STREAM),
            ):

                def pair(rate, load=load, r_method=r_method, e_method=e_method, bodies=bodies):
                    return [
                        (pids[0], partial(load, rch, r_method, bodies, rate)),
                        (pids[1], partial(load, ech, e_method, bodies, rate)),
                    ]

                await interleaved(pair(None), 0.4)  # warm-up
                r_max, e_max = await interleaved(pair(None), seconds)
                half = r_max["per_s"] / 2
                before = latency_buckets(metrics_port)
                r_half, e_half = await interleaved(pair(half), seconds)
                after = latency_buckets(metrics_port)
                row = {
                    "tokens": size,
                    "mode": mode,
                    "router_max": r_max,
                    "echo_max": e_max,
                    "half_rate_per_s": half,
                    "router_half": r_half,
                    "echo_half": e_half,
                    "throughput_share": r_max["per_s"] / e_max["per_s"],
                    "added_p99_ms_at_half": r_half["p99_ms"] - e_half["p99_ms"],
                    "in_router_p99_ms_at_half_at_most": bucket_quantile(before, after, 0.99),
                }
                rows.append(row)
                print_row(row)
    return rows


def print_header() -> None:
    print(
        f"{'tokens':>7} {'mode':>6} | {'router/s':>9} {'p50 ms':>7} {'p99 ms':>7} | "
        f"{'echo/s':>9} {'p50 ms':>7} {'p99 ms':>7} | {'share':>6} | "
        f"{'half/s':>7} {'r p99':>6} {'e p99':>6} {'added':>6} {'in-rtr':>6} | "
        f"{'cpu us r/e':>11}"
    )


def print_row(r: dict) -> None:
    rm, em, rh, eh = r["router_max"], r["echo_max"], r["router_half"], r["echo_half"]
    print(
        f"{r['tokens']:>7} {r['mode']:>6} | {rm['per_s']:>9,.0f} {rm['p50_ms']:>7.2f} "
        f"{rm['p99_ms']:>7.2f} | {em['per_s']:>9,.0f} {em['p50_ms']:>7.2f} "
        f"{em['p99_ms']:>7.2f} | {r['throughput_share']:>6.2f} | {r['half_rate_per_s']:>7,.0f} "
        f"{rh['p99_ms']:>6.2f} {eh['p99_ms']:>6.2f} {r['added_p99_ms_at_half']:>6.2f} "
        f"{r['in_router_p99_ms_at_half_at_most']:>6.2f} | "
        f"{rm['server_cpu_us']:>5.0f}/{em['server_cpu_us']:<5.0f}",
        flush=True,
    )


def verdicts(rows: list[dict]) -> dict:
    at_4k = [r for r in rows if r["tokens"] == 4_096]
    at_128k = [r for r in rows if r["tokens"] == 131_072]
    return {
        "4k_share_at_least_0.80": all(
            r["throughput_share"] >= TARGET_THROUGHPUT_SHARE for r in at_4k
        )
        if at_4k
        else None,
        "added_p99_at_half_load_at_most_1ms": all(
            r["added_p99_ms_at_half"] <= TARGET_ADDED_P99_MS for r in rows
        ),
        "128k_at_least_1000_per_s": max(r["router_max"]["per_s"] for r in at_128k)
        >= TARGET_128K_PER_S
        if at_128k
        else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short cells, for a smoke run")
    parser.add_argument("--echo-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.echo_server:
        uvloop.run(echo_server())
        return 0
    seconds = 1.0 if args.quick else 4.0
    with tempfile.TemporaryDirectory() as tmp:
        router_proc, router, metrics_port = start_router(Path(tmp) / "router.log")
        echo_proc, echo = start_echo()
        try:
            print_header()
            pids = (router_proc.pid, echo_proc.pid)
            rows = uvloop.run(measure(router, metrics_port, echo, pids, SIZES, seconds))
        finally:
            for proc in (router_proc, echo_proc):
                proc.terminate()
                proc.wait(30)
    result = {
        "bench": "service",
        "workers": WORKERS,
        "in_flight": IN_FLIGHT,
        "seconds_per_cell": seconds,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "grpc": grpc.__version__,
        "rows": rows,
        "targets": verdicts(rows),
    }
    if not args.quick:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["targets"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
