"""The router under load, all at once: many concurrent RouteStream clients,
a stream of KV events, and workers joining and leaving. Prints a table and
writes bench/results/load_bench.json.

The router is its own `kvrouter serve` process with an index bound
(`--max-index-blocks`). This process drives it (grpc.aio on uvloop):

  * `--streams` RouteStream calls, each a closed loop of one request at a
    time (a 64-block prompt sharing a prefix with a worker's cache);
  * `--events-per-s` stored blocks per second, as batches of 64 blocks on
    one Publish stream per worker;
  * every `--churn-s`, one worker deregisters and a new one registers and
    starts publishing.

Reported: errors (any non-OK answer, with the first one's details per kind),
p50/p99 latency per request, events applied per second, the router's RSS
every second, and the CPU seconds the router and this driver used.

    .venv/bin/python bench/load_bench.py                 # the full target
    .venv/bin/python bench/load_bench.py --streams 1000 --events-per-s 20000 --duration 30
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import uvloop

from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

RESULTS = Path(__file__).resolve().parent / "results" / "load_bench.json"
BLOCK = 16
BATCH_BLOCKS = 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Load:
    def __init__(self, args, target: str) -> None:
        self.args = args
        self.channel = grpc.aio.insecure_channel(target)
        # Workers reach the router over their own connection, as real ones
        # do, not queued behind thousands of client streams.
        self.worker_channel = grpc.aio.insecure_channel(target)
        self.router = router_pb2_grpc.RouterStub(self.channel)
        self.registry = router_pb2_grpc.RegistryStub(self.worker_channel)
        self.events = router_pb2_grpc.KvEventsStub(self.worker_channel)
        self.latencies: list[float] = []
        self.errors: dict[str, int] = {}
        self.error_details: dict[str, str] = {}
        self.requests = 0
        self.finished_after_leave = 0
        self.blocks_acked = 0
        self.stop = asyncio.Event()
        self.worker_ids = itertools.count(1)
        self.worker_tasks: dict[int, tuple[asyncio.Task, asyncio.Task]] = {}

    def error(self, what: str, details: str = "") -> None:
        self.errors[what] = self.errors.get(what, 0) + 1
        self.error_details.setdefault(what, details)

    async def join(self) -> None:
        worker_id = next(self.worker_ids)
        request = pb.RegisterRequest(
            worker_id=worker_id, role=pb.ROLE_BOTH, block_size=BLOCK, capacity_blocks=1 << 20
        )
        await self.registry.Register(request, timeout=10)
        self.worker_tasks[worker_id] = (
            asyncio.create_task(self.heartbeat(worker_id)),
            asyncio.create_task(self.publish(worker_id)),
        )

    async def leave(self) -> None:
        worker_id = min(self.worker_tasks)
        for task in self.worker_tasks.pop(worker_id):
            task.cancel()
        try:
            await self.registry.Deregister(pb.DeregisterRequest(worker_id=worker_id), timeout=10)
        except grpc.RpcError as e:
            self.error(f"deregister {e.code().name}", e.details())

    async def heartbeat(self, worker_id: int) -> None:
        """Each worker on its own, as real ones are: one slow answer holds
        back no other worker's heartbeat past the router's TTL."""
        while True:
            try:
                await self.registry.Heartbeat(pb.HeartbeatRequest(worker_id=worker_id), timeout=10)
            except grpc.RpcError as e:
                # NOT_FOUND: the router expired a worker that had not left.
                self.error(f"heartbeat {e.code().name}", e.details())
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    return
            await asyncio.sleep(0.5)

    async def publish(self, worker_id: int) -> None:
        """Batches of 64 fresh blocks at this worker's share of the rate."""
        rng = random.Random(worker_id)
        interval = BATCH_BLOCKS * self.args.workers / self.args.events_per_s
        # Bounded, so a router that falls behind slows the publisher down
        # instead of piling batches up in the driver.
        queue: asyncio.Queue = asyncio.Queue(maxsize=64)
        await queue.put(
            pb.PublishRequest(
                hello=pb.PublishHello(worker_id=worker_id, next_seq=0, block_size=BLOCK)
            )
        )
        call = self.events.Publish(iter_queue(queue))
        reader = asyncio.create_task(self.read_acks(call))
        next_id = 1
        started = time.monotonic()
        try:
            for seq in itertools.count():
                ids = list(range(next_id, next_id + BATCH_BLOCKS))
                next_id += BATCH_BLOCKS
                stored = pb.StoredEvent(
                    block_ids=ids, local_hashes=[rng.getrandbits(64) for _ in ids]
                )
                batch = pb.EventBatch(seq=seq, events=[pb.KvEvent(stored=stored)])
                await queue.put(pb.PublishRequest(batch=batch))
                # Paced by the clock: a late wake-up (the driver's loop is
                # busy with thousands of streams) sends the batches it owes
                # at once instead of lowering the rate.
                await asyncio.sleep(max(0.0, started + (seq + 1) * interval - time.monotonic()))
        finally:
            reader.cancel()
            call.cancel()

    async def read_acks(self, call) -> None:
        try:
            async for reply in call:
                if reply.WhichOneof("kind") == "ack" and reply.ack.next_seq > 0:
                    self.blocks_acked += BATCH_BLOCKS
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.CANCELLED, grpc.StatusCode.NOT_FOUND):
                self.error(f"events {e.code().name}", e.details())

    async def finished(self, request_id: str) -> None:
        report = pb.LifecycleReport(request_id=request_id, event=pb.LIFECYCLE_EVENT_FINISHED)
        try:
            await self.router.ReportLifecycle(report, timeout=30)
        except grpc.RpcError as e:
            # A worker that left took its bookings along: the report finds none.
            if e.code() == grpc.StatusCode.NOT_FOUND:
                self.finished_after_leave += 1
            else:
                self.error(f"lifecycle {e.code().name}", e.details())

    async def route_stream(self, index: int) -> None:
        rng = random.Random(index)
        queue: asyncio.Queue = asyncio.Queue()
        call = self.router.RouteStream(iter_queue(queue))
        responses = aiter(call)
        try:
            while not self.stop.is_set():
                tokens = [rng.randrange(1000) for _ in range(16)] * (64 * BLOCK // 16)
                started = time.perf_counter()
                await queue.put(pb.RouteRequest(tokens=tokens))
                response = await anext(responses)
                self.latencies.append(time.perf_counter() - started)
                self.requests += 1
                if response.HasField("error"):
                    self.error(f"route {response.error.code}")
                else:
                    await self.finished(response.request_id)
        except grpc.RpcError as e:
            self.error(f"stream {e.code().name}", e.details())
        except StopAsyncIteration:
            self.error("stream ended")
        finally:
            await queue.put(None)
            call.cancel()


async def iter_queue(queue: asyncio.Queue):
    while (item := await queue.get()) is not None:
        yield item


async def drive(args, target: str, pid: int) -> dict:
    load = Load(args, target)
    for _ in range(args.workers):
        await load.join()
    tasks = [asyncio.create_task(load.route_stream(i)) for i in range(args.streams)]
    samples = []
    started = time.monotonic()
    last_churn = started
    last = (started, 0, 0)
    while (now := time.monotonic()) - started < args.duration:
        await asyncio.sleep(1.0)
        now = time.monotonic()
        if now - last_churn >= args.churn_s:
            last_churn = now
            await load.leave()
            await load.join()
        dt = now - last[0]
        samples.append(
            {
                "t_s": round(now - started, 1),
                "rss_mb": round(rss_mb(pid), 1),
                "routes_per_s": round((load.requests - last[1]) / dt),
                "events_per_s": round((load.blocks_acked - last[2]) / dt),
            }
        )
        last = (now, load.requests, load.blocks_acked)
        print(samples[-1], flush=True)
    cpu = {"router_s": cpu_s(pid), "driver_s": cpu_s(os.getpid())}
    load.stop.set()
    await asyncio.wait(tasks, timeout=10)
    for task in [*tasks, *itertools.chain(*load.worker_tasks.values())]:
        task.cancel()
    await load.channel.close()
    await load.worker_channel.close()
    lat = sorted(load.latencies)
    steady = samples[len(samples) // 2 :]
    return {
        "streams": args.streams,
        "target_events_per_s": args.events_per_s,
        "workers": args.workers,
        "churn_s": args.churn_s,
        "duration_s": args.duration,
        "requests": load.requests,
        "errors": load.errors,
        "error_details": load.error_details,
        "finished_after_worker_left": load.finished_after_leave,
        "p50_ms": 1e3 * lat[len(lat) // 2] if lat else None,
        "p99_ms": 1e3 * lat[int(len(lat) * 0.99)] if lat else None,
        "routes_per_s": sum(s["routes_per_s"] for s in steady) / max(1, len(steady)),
        "events_per_s": sum(s["events_per_s"] for s in steady) / max(1, len(steady)),
        "rss_mb": [s["rss_mb"] for s in samples],
        "cpu_s": cpu,
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=5000)
    parser.add_argument("--events-per-s", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--churn-s", type=float, default=2.0, help="one worker leaves and joins")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--max-index-blocks", type=int, default=500_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    port = free_port()
    router = subprocess.Popen(
        [
            sys.executable, "-m", "kvrouter.cli", "serve",
            "--listen", f"127.0.0.1:{port}", "--metrics-listen", "",
            "--log-decisions", "false", "--log-level", "warning",
            "--max-index-blocks", str(args.max_index_blocks),
        ],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        target = f"127.0.0.1:{port}"
        with grpc.insecure_channel(target) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
        result = uvloop.run(drive(args, target, router.pid))
    finally:
        router.terminate()
        router.wait(30)
    print(
        f"streams {result['streams']}  requests {result['requests']}  errors {result['errors']}  "
        f"p50 {result['p50_ms']:.1f} ms  p99 {result['p99_ms']:.1f} ms  "
        f"routes/s {result['routes_per_s']:.0f}  events/s {result['events_per_s']:.0f}  "
        f"RSS MB {result['rss_mb'][0]} -> {max(result['rss_mb'])} (max) -> {result['rss_mb'][-1]}  "
        f"CPU s router {result['cpu_s']['router_s']:.0f} driver {result['cpu_s']['driver_s']:.0f}"
    )
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
