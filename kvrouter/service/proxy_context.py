"""What every proxied request shares: channels to the workers, the HTTP
client for OpenAI-compatible engines, the worker table, the policy, recent
worker failures (and those per request: the breaker) and fire-and-forget
releases."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from kvrouter.net.credentials import Credentials
from kvrouter.net.worker_channels import WorkerChannels
from kvrouter.net.worker_protocol import OPENAI
from kvrouter.policy import Router
from kvrouter.proto_gen import worker_pb2 as wpb
from kvrouter.service.breaker import RequestBreaker
from kvrouter.service.engine_split import Protocol, protocol_for
from kvrouter.service.openai_worker import EngineClient
from kvrouter.service.proxy_config import ProxyConfig
from kvrouter.service.workers import WorkerTable

log = logging.getLogger("kvrouter.service.proxy")


class ProxyContext:
    def __init__(
        self, policy: Router, workers: WorkerTable, config: ProxyConfig, credentials: Credentials
    ) -> None:
        self.policy = policy
        self.workers = workers
        self.config = config
        self.channels = WorkerChannels(credentials)
        self.engines = EngineClient(credentials, workers.data_parallel_rank)
        self._cooldown: dict[int, float] = {}
        self.breaker = RequestBreaker(config.breaker_trip_after, config.breaker_max_requests)
        self._background: set[asyncio.Task] = set()

    def address(self, worker_id: int) -> str:
        return self.workers.address(worker_id)

    def over_http(self, worker_id: int) -> bool:
        """Whether the worker is an OpenAI-compatible engine (openai_worker.py)."""
        return self.workers.protocol(worker_id) == OPENAI

    def engine_split(self, prefill_id: int, decode_id: int) -> Protocol | None:
        """How two engines split a request between them (service/engine_split/):
        both over HTTP and registered with the same kv_transfer; None if
        they cannot, or if the prefill engine failed lately (a dead or
        hung one would cost every request its timeout until it leaves
        routing)."""
        if not (self.over_http(prefill_id) and self.over_http(decode_id)):
            return None
        if self.cooling_down(prefill_id):
            return None
        kv_transfer = self.workers.kv_transfer(prefill_id)
        if kv_transfer != self.workers.kv_transfer(decode_id):
            return None
        return protocol_for(kv_transfer)

    def cool_down(self, worker_id: int) -> None:
        self._cooldown[worker_id] = time.monotonic() + self.config.failure_cooldown_s

    def cooling_down(self, worker_id: int) -> bool:
        until = self._cooldown.get(worker_id)
        if until is None:
            return False
        if until <= time.monotonic():
            del self._cooldown[worker_id]
            return False
        return True

    def release_later(self, address: str, request_id: str) -> None:
        """Unpins a hand-off on its prefill worker without waiting (the lease
        TTL covers a release that never arrives)."""
        task = asyncio.get_running_loop().create_task(self._release(address, request_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _release(self, address: str, request_id: str) -> None:
        try:
            await self.channels.stub(address).Release(
                wpb.ReleaseRequest(request_id=request_id), timeout=self.config.release_timeout_s
            )
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                log.info(
                    "release failed; the lease will lapse",
                    extra={
                        "fields": {
                            "request_id": request_id,
                            "address": address,
                            "code": e.code().name,
                        }
                    },
                )

    async def close(self) -> None:
        if self._background:
            await asyncio.wait(list(self._background), timeout=self.config.release_timeout_s)
        await self.channels.close()
        await self.engines.close()
