"""The Registry service: workers register, heartbeat, deregister and list."""

from __future__ import annotations

import time

from kvrouter.net.worker_protocol import (
    KV_TRANSFER_NAMES,
    KV_TRANSFER_VALUES,
    PROTOCOL_NAMES,
    PROTOCOL_VALUES,
)
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc
from kvrouter.service.config import ServiceConfig
from kvrouter.service.convert import ROLE_NAMES, ROLE_VALUES
from kvrouter.service.errors import ServiceError, invalid
from kvrouter.service.events import EventIngest
from kvrouter.service.workers import WorkerRecord, WorkerTable


class RegistryService(router_pb2_grpc.RegistryServicer):
    def __init__(self, workers: WorkerTable, events: EventIngest, config: ServiceConfig) -> None:
        self.workers = workers
        self.events = events
        self.config = config

    async def Register(self, request, context):
        try:
            role = ROLE_NAMES.get(request.role)
            if role is None:
                raise invalid("role must be ROLE_PREFILL, ROLE_DECODE or ROLE_BOTH")
            protocol = PROTOCOL_NAMES.get(request.protocol)
            if protocol is None:
                raise invalid("protocol must be WORKER_PROTOCOL_KVROUTER or WORKER_PROTOCOL_OPENAI")
            kv_transfer = KV_TRANSFER_NAMES.get(request.kv_transfer)
            if kv_transfer is None:
                raise invalid("kv_transfer must be KV_TRANSFER_NONE, _VLLM or _SGLANG")
            worker_id = (
                request.worker_id if request.HasField("worker_id") else await self.workers.next_id()
            )
            record = WorkerRecord(
                worker_id=worker_id,
                role=role,
                address=request.address,
                block_size=request.block_size,
                capacity_blocks=request.capacity_blocks,
                model=request.model,
                adapters=tuple(request.adapters),
                protocol=protocol,
                metadata=dict(request.metadata),
                publishes_events=request.publishes_events,
                kv_transfer=kv_transfer,
                bootstrap_port=request.bootstrap_port,
                data_parallel_rank=(
                    request.data_parallel_rank if request.HasField("data_parallel_rank") else None
                ),
            )
            token = self.workers.register(record, request.registration_token)
        except ServiceError as e:
            await context.abort(e.code, e.message)
        return pb.RegisterResponse(
            worker_id=worker_id,
            registration_token=token,
            heartbeat_interval_s=self.config.heartbeat_interval_s,
            heartbeat_ttl_s=self.config.heartbeat_ttl_s,
        )

    async def Heartbeat(self, request, context):
        try:
            self.workers.heartbeat(
                request.worker_id,
                request.registration_token,
                request.queued_prefill_tokens,
                request.active_decode_blocks,
                request.active_requests,
            )
        except ServiceError as e:
            await context.abort(e.code, e.message)
        return pb.HeartbeatResponse()

    async def Deregister(self, request, context):
        try:
            self.workers.proven(request.worker_id, request.registration_token)
            self.workers.remove(request.worker_id, "deregistered")
        except ServiceError as e:
            await context.abort(e.code, e.message)
        self.events.close_stream(request.worker_id, "deregistered")
        return pb.DeregisterResponse()

    async def List(self, request, context):
        now = time.monotonic()
        positions = self.workers.index.workers()
        infos = []
        for r in sorted(self.workers.records(), key=lambda r: r.worker_id):
            blocks, next_seq = positions.get(r.worker_id, (0, 0))
            infos.append(
                pb.WorkerInfo(
                    worker_id=r.worker_id,
                    role=ROLE_VALUES[r.role],
                    address=r.address,
                    block_size=r.block_size,
                    capacity_blocks=r.capacity_blocks,
                    metadata=r.metadata,
                    model=r.model,
                    adapters=r.adapters,
                    protocol=PROTOCOL_VALUES[r.protocol],
                    kv_transfer=KV_TRANSFER_VALUES[r.kv_transfer],
                    bootstrap_port=r.bootstrap_port,
                    data_parallel_rank=r.data_parallel_rank,
                    routable=not r.stale,
                    seconds_since_heartbeat=now - r.last_heartbeat,
                    index_blocks=blocks,
                    next_event_seq=next_seq,
                    queued_prefill_tokens=r.queued_prefill_tokens,
                    active_decode_blocks=r.active_decode_blocks,
                    active_requests=r.active_requests,
                )
            )
        return pb.ListWorkersResponse(workers=infos)
