"""Workers started for real on 127.0.0.1 (free ports), each on an event loop
of its own thread: what the worker and security tests share."""

from __future__ import annotations

import asyncio
import threading

import grpc
from threaded_router import close_loop_thread

from kvrouter.proto_gen import worker_pb2 as wpb
from kvrouter.proto_gen import worker_pb2_grpc
from kvrouter.worker import WorkerConfig, WorkerServer


class RunningWorker:
    def __init__(self, config: WorkerConfig) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server = WorkerServer(config)
        self._call(self.server.start())
        self.address = self.server.address
        self.channel = grpc.insecure_channel(self.address)
        self.stub = worker_pb2_grpc.WorkerStub(self.channel)
        self.stopped = False

    def _call(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def status(self) -> wpb.StatusResponse:
        return self.stub.Status(wpb.StatusRequest(), timeout=10)

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.channel.close()
        self._call(self.server.stop(grace=0))
        close_loop_thread(self.loop, self._thread)


def started_workers(model: str, **defaults):
    """The body of a `start_worker` fixture: `start(**overrides)` starts a
    worker serving `model`; every worker started is stopped after the test."""
    started: list[RunningWorker] = []

    def start(**overrides) -> RunningWorker:
        worker = RunningWorker(WorkerConfig(model=model, **{**defaults, **overrides}))
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
