"""A decision that pairs a kvrouter prefill worker with an engine over HTTP
runs on the engine alone: engines take no hand-off, so the router neither
prefills elsewhere nor streams a first token of another worker's; and an
engine registered to prefill is never sent a kvrouter Prefill. A real
router and kvrouter worker (on CPU, a tiny checkpoint) and a stub engine on
127.0.0.1."""

from __future__ import annotations

import asyncio
import random

import grpc
from waiting import wait_until

from kvrouter.client.generate import GenerateClient
from kvrouter.demo.cluster import LocalCluster
from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint
from kvrouter.proto_gen import worker_pb2 as wpb
from kvrouter.proto_gen import worker_pb2_grpc

from .helpers import MODEL, booked, probe, register
from .stub import StubEngine


def start_cluster(tmp_path_factory, role: str) -> LocalCluster:
    model = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"), "llama", seed=11)
    return LocalCluster(
        model,
        [role],
        # Every prompt of more than a block is worth a prefill worker.
        router_env={"KVROUTER_POLICY_LOCAL_PREFILL_MAX_TOKENS": "16"},
        worker_args=["--num-kv-blocks", "512"],
        served_models=[MODEL],
        log_dir=tmp_path_factory.mktemp("cluster-logs"),
    ).start()


def long_prompt() -> list[int]:
    rng = random.Random(5)
    return [rng.randrange(3, 256) for _ in range(200)]


def generate(target: str, prompt: list[int]):
    async def run():
        async with GenerateClient(target, model=MODEL, timeout=60) as client:
            return await client.generate(prompt, max_tokens=5)

    return asyncio.run(run())


def test_a_split_decision_for_an_engine_runs_on_the_engine_alone(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, "prefill")
    stub = StubEngine(list(range(40, 60))).start()
    registration = register(cluster.target, stub)
    try:
        prefill = next(w for w in cluster.list_workers() if w.role == "prefill")
        prompt = long_prompt()
        wait_until(lambda: probe(cluster.target, prompt).disaggregated, what="a split decision")
        decision = probe(cluster.target, prompt)
        assert (decision.prefill_worker, decision.decode_worker) == (
            prefill.worker_id,
            registration.worker_id,
        )
        answer = generate(cluster.target, prompt)
        assert answer.token_ids == stub.tokens[:5]
        assert (answer.prefill_worker, answer.decode_worker) == (None, registration.worker_id)
        (sent,) = stub.received
        assert sent["prompt"] == prompt
        with grpc.insecure_channel(prefill.address) as channel:
            status = worker_pb2_grpc.WorkerStub(channel).Status(wpb.StatusRequest(), timeout=5)
        assert status.cached_blocks == 0, "the prefill worker prefilled the prompt"
        wait_until(lambda: not any(booked(cluster.target).values()), what="the booking to close")
    finally:
        registration.stop_background()
        stub.stop()
        cluster.stop()


def test_an_engine_registered_to_prefill_is_not_sent_a_prefill(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, "decode")
    stub = StubEngine(list(range(40, 60))).start()
    registration = register(cluster.target, stub, role="prefill")
    try:
        decode = next(w for w in cluster.list_workers() if w.role == "decode")
        prompt = long_prompt()
        wait_until(lambda: probe(cluster.target, prompt).disaggregated, what="a split decision")
        assert probe(cluster.target, prompt).prefill_worker == registration.worker_id
        answer = generate(cluster.target, prompt)
        assert (answer.prefill_worker, answer.decode_worker) == (None, decode.worker_id)
        assert answer.stats.retries == 0, "a Prefill was tried on the engine"
        assert not stub.received
    finally:
        registration.stop_background()
        stub.stop()
        cluster.stop()
