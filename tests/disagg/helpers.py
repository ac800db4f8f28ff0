"""Prompts, requests through the router and cluster checks for the
end-to-end tests."""

from __future__ import annotations

import asyncio
import json
import random
import urllib.error
import urllib.request

import grpc

from kvrouter.client import RouterClient
from kvrouter.client.generate import GenerateClient, Generation
from kvrouter.proto_gen import worker_pb2 as wpb
from kvrouter.proto_gen import worker_pb2_grpc

BLOCK = 16


def prompt(seed: int, length: int, vocab: int = 256) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(length)]


def generate(target: str, tokens: list[int], max_tokens: int, **kwargs) -> Generation:
    async def run() -> Generation:
        async with GenerateClient(target, timeout=60.0) as client:
            return await client.generate(tokens, max_tokens=max_tokens, ignore_eos=True, **kwargs)

    return asyncio.run(run())


def overlap(target: str, tokens: list[int], worker_id: int, model: str = "") -> int:
    """Blocks of `tokens` (a prompt for `model`) the router's index holds
    for `worker_id`."""
    with RouterClient(target) as router:
        result = router.route(tokens, model=model, explain=True)
        router.cancelled(result.request_id)
    candidates = result.explanation.decode_candidates + result.explanation.prefill_candidates
    return max((c.overlap for c in candidates if c.worker_id == worker_id), default=0)


def worker_status(address: str) -> wpb.StatusResponse:
    with grpc.insecure_channel(address) as channel:
        return worker_pb2_grpc.WorkerStub(channel).Status(wpb.StatusRequest(), timeout=5)


def all_idle(cluster) -> bool:
    """Every live worker: nothing running, no lease, no block pinned."""
    for info in cluster.list_workers():
        process = cluster.workers.get(info.worker_id)
        if process is None or process.poll() is not None:
            continue
        try:
            s = worker_status(info.address)
        except grpc.RpcError:
            return False
        if s.running_requests or s.waiting_requests or s.leases or s.blocks_in_use:
            return False
    return True


def http_get(url: str) -> tuple[int, dict]:
    """(status, JSON body), error statuses included."""
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def http_post(url: str, body: bytes, headers: dict | None = None) -> tuple[int, dict, dict]:
    """(status, headers, JSON body) of a JSON POST, error statuses included."""
    request = urllib.request.Request(
        url, body, {"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, dict(r.headers), json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.load(e)


def log_tail(cluster, name: str = "router", lines: int = 30) -> str:
    """The end of a cluster process's log, for an assertion's message."""
    log = cluster.log_dir / f"{name}.log"
    return f"{log} ends:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
