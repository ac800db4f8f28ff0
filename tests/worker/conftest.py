"""Workers started for real on 127.0.0.1 (free ports), each on an event loop
of its own thread, with no router; and a plain engine as the reference."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from kvrouter.engine import EngineConfig, LLMEngine, SamplingParams
from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint
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
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"), "llama", seed=3)


@pytest.fixture
def start_worker(tiny_model):
    started: list[RunningWorker] = []

    def start(**overrides) -> RunningWorker:
        settings = dict(model=str(tiny_model), num_kv_blocks=128, torch_threads=0)
        worker = RunningWorker(WorkerConfig(**{**settings, **overrides}))
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture(scope="session")
def reference(tiny_model):
    """Greedy tokens from a plain engine with no prefix cache: what every
    serving path must reproduce."""
    engine = LLMEngine(EngineConfig(model=str(tiny_model), enable_prefix_caching=False))

    def generate(prompt: list[int], max_tokens: int) -> list[int]:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        return engine.generate([prompt], params)[0].token_ids

    return generate
