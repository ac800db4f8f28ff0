"""The processes that drive the router in bench/load_bench.py, each on its
own uvloop: `clients` holds a share of the RouteStream calls, `workers`
registers the workers, heartbeats, publishes their KV events and makes them
leave and join. One event loop holding thousands of streams falls seconds
behind, and anything else on it (the publishers) falls behind with it.

Each process counts what it has done into a shared array the parent samples
every second, and hands back its details (latencies, errors) at the end.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from array import array

import grpc
import numpy as np
import uvloop

from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

BLOCK = 16
BATCH_BLOCKS = 64
PROMPT_BLOCKS = 64
# Distinct prompts each client process cycles through, built before the run
# so that no request is built while the clock runs.
PROMPTS = 4096
# Slots of the clients' shared counter array.
REQUESTS = 0
# Slots of the workers' shared counter array.
SENT, ACKED, JOINED = 0, 1, 2


class Errors:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.details: dict[str, str] = {}

    def add(self, what: str, details: str = "") -> None:
        self.counts[what] = self.counts.get(what, 0) + 1
        self.details.setdefault(what, details)


class LoopLag:
    """How late this process's event loop wakes up: every message it sends
    waits that long too."""

    INTERVAL_S = 0.1

    def __init__(self) -> None:
        self.lags = array("d")
        self.task = asyncio.create_task(self._measure())

    async def _measure(self) -> None:
        while True:
            started = time.monotonic()
            await asyncio.sleep(self.INTERVAL_S)
            self.lags.append(time.monotonic() - started - self.INTERVAL_S)

    def summary(self) -> dict:
        self.task.cancel()
        lags = sorted(self.lags)
        if not lags:
            return {}
        return {
            "mean_ms": round(1e3 * sum(lags) / len(lags), 1),
            "p99_ms": round(1e3 * lags[int(len(lags) * 0.99)], 1),
            "max_ms": round(1e3 * lags[-1], 1),
        }


def prompts(seed: int) -> list[pb.RouteRequest]:
    """64-block prompts, each a random 16-token block repeated, as the
    Python client sends them (little-endian u32 bytes)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 1000, size=(PROMPTS, BLOCK), dtype="<u4")
    return [pb.RouteRequest(tokens_u32le=np.tile(b, PROMPT_BLOCKS).tobytes()) for b in blocks]


class Clients:
    """Closed-loop RouteStream calls: one request at a time, each finished
    with a lifecycle report."""

    def __init__(self, channel: grpc.aio.Channel, seed: int, counts) -> None:
        self.router = router_pb2_grpc.RouterStub(channel)
        self.prompts = prompts(seed)
        self.counts = counts
        # Seconds per request: the first on each stream (which waits for the
        # call to open) apart from the rest, and each lifecycle report.
        self.latencies = array("d")
        self.first_latencies = array("d")
        self.report_latencies = array("d")
        self.errors = Errors()
        self.finished_after_leave = 0
        self.stopping = False

    async def finished(self, request_id: str) -> None:
        report = pb.LifecycleReport(request_id=request_id, event=pb.LIFECYCLE_EVENT_FINISHED)
        started = time.perf_counter()
        try:
            await self.router.ReportLifecycle(report, timeout=30)
            self.report_latencies.append(time.perf_counter() - started)
        except grpc.RpcError as e:
            # A worker that left took its bookings along: the report finds none.
            if e.code() == grpc.StatusCode.NOT_FOUND:
                self.finished_after_leave += 1
            else:
                self.errors.add(f"lifecycle {e.code().name}", e.details())

    async def route_stream(self, index: int) -> None:
        call = self.router.RouteStream()
        latencies = self.first_latencies
        try:
            for prompt in itertools.islice(itertools.cycle(self.prompts), index, None):
                if self.stopping:
                    break
                started = time.perf_counter()
                await call.write(prompt)
                response = await call.read()
                if response is grpc.aio.EOF:
                    self.errors.add("stream ended")
                    return
                latencies.append(time.perf_counter() - started)
                latencies = self.latencies
                self.counts[REQUESTS] += 1
                if response.HasField("error"):
                    self.errors.add(f"route {response.error.code}", response.error.message)
                else:
                    await self.finished(response.request_id)
            await call.done_writing()
        except grpc.RpcError as e:
            self.errors.add(f"stream {e.code().name}", e.details())
        finally:
            call.cancel()


async def drive_clients(target: str, first: int, streams: int, counts, start, stop) -> dict:
    async with grpc.aio.insecure_channel(target) as channel:
        clients = Clients(channel, first, counts)
        await asyncio.to_thread(start.wait)
        lag = LoopLag()
        tasks = [asyncio.create_task(clients.route_stream(first + i)) for i in range(streams)]
        await asyncio.to_thread(stop.wait)
        clients.stopping = True
        await asyncio.wait(tasks, timeout=10)
        for task in tasks:
            task.cancel()
        return {
            "latencies": {
                "route": clients.latencies,
                "first_route": clients.first_latencies,
                "report": clients.report_latencies,
            },
            "errors": clients.errors.counts,
            "error_details": clients.errors.details,
            "finished_after_worker_left": clients.finished_after_leave,
            "loop_lag": lag.summary(),
        }


class Workers:
    """Workers that heartbeat and publish fresh stored blocks, as batches of
    64 on one Publish stream each, at an equal share of `events_per_s`."""

    def __init__(self, channel: grpc.aio.Channel, n: int, events_per_s: int, counts) -> None:
        self.registry = router_pb2_grpc.RegistryStub(channel)
        self.events = router_pb2_grpc.KvEventsStub(channel)
        self.batch_interval_s = BATCH_BLOCKS * n / events_per_s
        self.counts = counts
        self.errors = Errors()
        self.ids = itertools.count(1)
        self.tasks: dict[int, tuple[asyncio.Task, asyncio.Task]] = {}
        # Each worker's registration token, which its heartbeats and leaving carry.
        self.tokens: dict[int, int] = {}
        # Batches each worker has had acknowledged, past and present workers.
        self.acked: dict[int, int] = {}

    async def join(self) -> None:
        worker_id = next(self.ids)
        request = pb.RegisterRequest(
            worker_id=worker_id, role=pb.ROLE_BOTH, block_size=BLOCK, capacity_blocks=1 << 20
        )
        response = await self.registry.Register(request, timeout=10)
        self.tokens[worker_id] = response.registration_token
        self.counts[JOINED] += 1
        self.tasks[worker_id] = (
            asyncio.create_task(self.heartbeat(worker_id)),
            asyncio.create_task(self.publish(worker_id)),
        )

    async def leave(self) -> None:
        worker_id = min(self.tasks)
        for task in self.tasks.pop(worker_id):
            task.cancel()
        try:
            leave = pb.DeregisterRequest(
                worker_id=worker_id, registration_token=self.tokens.pop(worker_id)
            )
            await self.registry.Deregister(leave, timeout=10)
        except grpc.RpcError as e:
            self.errors.add(f"deregister {e.code().name}", e.details())

    async def heartbeat(self, worker_id: int) -> None:
        """Each worker on its own, as real ones are: one slow answer holds
        back no other worker's heartbeat past the router's TTL."""
        while True:
            try:
                beat = pb.HeartbeatRequest(
                    worker_id=worker_id, registration_token=self.tokens[worker_id]
                )
                await self.registry.Heartbeat(beat, timeout=10)
            except grpc.RpcError as e:
                # NOT_FOUND: the router expired a worker that had not left.
                self.errors.add(f"heartbeat {e.code().name}", e.details())
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    return
            await asyncio.sleep(0.5)

    async def publish(self, worker_id: int) -> None:
        rng = random.Random(worker_id)
        call = self.events.Publish()
        reader = asyncio.create_task(self.read_acks(worker_id, call))
        try:
            hello = pb.PublishHello(worker_id=worker_id, next_seq=0, block_size=BLOCK)
            await call.write(pb.PublishRequest(hello=hello))
            started = time.monotonic()
            for seq in itertools.count():
                first = 1 + seq * BATCH_BLOCKS
                stored = pb.StoredEvent(
                    block_ids=range(first, first + BATCH_BLOCKS),
                    local_hashes=[rng.getrandbits(64) for _ in range(BATCH_BLOCKS)],
                )
                batch = pb.EventBatch(
                    seq=seq, events=[pb.KvEvent(stored=stored)], emitted_at=time.time()
                )
                # Waits while the router's flow-control window is full, so a
                # router that falls behind slows the publisher down.
                await call.write(pb.PublishRequest(batch=batch))
                self.counts[SENT] += BATCH_BLOCKS
                # Paced by the clock: a late wake-up sends the batches it owes
                # at once instead of lowering the rate.
                due = started + (seq + 1) * self.batch_interval_s
                await asyncio.sleep(max(0.0, due - time.monotonic()))
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.CANCELLED, grpc.StatusCode.NOT_FOUND):
                self.errors.add(f"events {e.code().name}", e.details())
        finally:
            reader.cancel()
            call.cancel()

    async def read_acks(self, worker_id: int, call) -> None:
        try:
            async for reply in call:
                if reply.WhichOneof("kind") == "ack":
                    acked = reply.ack.next_seq
                    self.counts[ACKED] += BATCH_BLOCKS * (acked - self.acked.get(worker_id, 0))
                    self.acked[worker_id] = acked
                else:
                    self.errors.add(f"events {reply.WhichOneof('kind')}", str(reply))
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.CANCELLED, grpc.StatusCode.NOT_FOUND):
                self.errors.add(f"events {e.code().name}", e.details())


class BigBatches:
    """A worker that publishes the biggest batches the router takes, back to
    back: one storing `events` one-block events (with their tokens, as
    kvrouter workers send them), the next removing them.
    The requests are serialized once; a batch's number is prepended as a
    message of its own, which protobuf merges into the same batch."""

    def __init__(self, channel: grpc.aio.Channel, worker_id: int, events: int) -> None:
        self.channel = channel
        self.worker_id = worker_id
        stored = [
            pb.KvEvent(
                stored=pb.StoredEvent(
                    block_ids=[i + 1], token_ids=range(BLOCK * i, BLOCK * (i + 1))
                )
            )
            for i in range(events)
        ]
        removed = [pb.KvEvent(removed=pb.RemovedEvent(block_ids=[i + 1])) for i in range(events)]
        self.bodies = [
            pb.PublishRequest(batch=pb.EventBatch(events=e)).SerializeToString()
            for e in (stored, removed)
        ]
        self.apply_s = array("d")
        self.errors = Errors()

    async def run(self) -> None:
        registry = router_pb2_grpc.RegistryStub(self.channel)
        request = pb.RegisterRequest(
            worker_id=self.worker_id, role=pb.ROLE_BOTH, block_size=BLOCK, capacity_blocks=1 << 20
        )
        token = (await registry.Register(request, timeout=10)).registration_token
        publish = self.channel.stream_stream(
            "/kvrouter.v1.KvEvents/Publish",
            request_serializer=None,
            response_deserializer=pb.PublishReply.FromString,
        )
        call = publish()
        hello = pb.PublishHello(worker_id=self.worker_id, next_seq=0, block_size=BLOCK)
        await call.write(pb.PublishRequest(hello=hello).SerializeToString())
        await call.read()
        try:
            for seq in itertools.count():
                head = pb.PublishRequest(batch=pb.EventBatch(seq=seq, emitted_at=time.time()))
                sent = time.monotonic()
                await call.write(head.SerializeToString() + self.bodies[seq % 2])
                reply = await call.read()
                if reply.WhichOneof("kind") != "ack" or reply.ack.next_seq != seq + 1:
                    self.errors.add("big batch not acknowledged", str(reply))
                    return
                self.apply_s.append(time.monotonic() - sent)
                beat = pb.HeartbeatRequest(worker_id=self.worker_id, registration_token=token)
                await registry.Heartbeat(beat, timeout=10)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                self.errors.add(f"big batch {e.code().name}", e.details())


async def drive_workers(
    target: str,
    n: int,
    events_per_s: int,
    churn_s: float,
    big_batch_workers: int,
    big_batch_events: int,
    counts,
    start,
    stop,
) -> dict:
    async with grpc.aio.insecure_channel(target) as channel:
        workers = Workers(channel, n, events_per_s, counts)
        for _ in range(n):
            await workers.join()
        big = [
            BigBatches(channel, 1_000_000 + i, big_batch_events) for i in range(big_batch_workers)
        ]
        await asyncio.to_thread(start.wait)
        big_tasks = [asyncio.create_task(b.run()) for b in big]
        lag = LoopLag()
        while not await asyncio.to_thread(stop.wait, churn_s):
            await workers.leave()
            await workers.join()
        for task in itertools.chain(*workers.tasks.values(), big_tasks):
            task.cancel()
        for b in big:
            for what, count in b.errors.counts.items():
                workers.errors.counts[what] = workers.errors.counts.get(what, 0) + count
                workers.errors.details.setdefault(what, b.errors.details[what])
        return {
            "errors": workers.errors.counts,
            "error_details": workers.errors.details,
            "loop_lag": lag.summary(),
            "big_batch_apply_s": list(itertools.chain(*(b.apply_s for b in big))),
        }


def clients_process(results, *args) -> None:
    results.put(("clients", uvloop.run(drive_clients(*args))))


def workers_process(results, *args) -> None:
    results.put(("workers", uvloop.run(drive_workers(*args))))
