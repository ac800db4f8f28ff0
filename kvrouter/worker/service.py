"""The Worker gRPC service: aggregated Generate, the prefill side
(Prefill, FetchBlocks, Release; prefill.py) and the decode side (Decode;
decode.py) of split requests, and Status. See docs/disaggregation.md."""

from __future__ import annotations

from contextlib import aclosing

from kvrouter.proto_gen import worker_pb2 as wpb
from kvrouter.proto_gen import worker_pb2_grpc
from kvrouter.worker.config import WorkerConfig
from kvrouter.worker.decode import DecodeSide
from kvrouter.worker.engine_loop import EngineLoop
from kvrouter.worker.leases import LeaseTable
from kvrouter.worker.prefill import PrefillSide
from kvrouter.worker.requests import Identity, Requests, abort_for
from kvrouter.worker.transfer import KvTransfer


class WorkerService(worker_pb2_grpc.WorkerServicer):
    def __init__(
        self,
        engine: EngineLoop,
        leases: LeaseTable,
        transfer: KvTransfer,
        config: WorkerConfig,
        identity: Identity,
    ) -> None:
        self.engine = engine
        self.leases = leases
        self.identity = identity
        self.requests = Requests(engine, config, identity)
        layout = engine.engine.kv_layout
        self.prefill_side = PrefillSide(self.requests, leases, layout)
        self.decode_side = DecodeSide(self.requests, transfer, layout)

    async def Generate(self, request, context):
        try:
            prompt, params, request_id = self.requests.parse(request)
        except ValueError as e:
            await abort_for(context, e, "bad request")
        handle = await self.requests.start(context, prompt, params, request_id)
        stream = self.requests.tokens(context, handle, request_id, len(prompt))
        async with aclosing(stream):
            async for response in stream:
                yield response

    async def Prefill(self, request, context):
        return await self.prefill_side.prefill(request, context)

    async def FetchBlocks(self, request, context):
        # grpc.aio recognises a streaming handler by its being an async generator.
        async for chunk in self.prefill_side.fetch_blocks(request, context):
            yield chunk

    async def Release(self, request, context):
        return await self.prefill_side.release(request, context)

    async def Decode(self, request, context):
        stream = self.decode_side.decode(request, context)
        async with aclosing(stream):
            async for response in stream:
                yield response

    async def Status(self, request, context):
        def status(engine) -> wpb.StatusResponse:
            load = engine.load()
            return wpb.StatusResponse(
                worker_id=self.identity.worker_id,
                role=self.identity.role,
                running_requests=load.num_running,
                waiting_requests=load.num_waiting,
                leases=len(self.leases),
                leased_blocks=self.leases.num_blocks,
                blocks_in_use=load.total_blocks - load.free_blocks,
                total_blocks=load.total_blocks,
                cached_blocks=len(engine.block_manager.cached),
            )

        return await self.engine.call(status)
