"""The Worker gRPC service: aggregated Generate, and the two halves of a
disaggregated request. Prefill computes the first token and pins the
prompt's blocks under a lease; Decode pulls the blocks it lacks through a
`KvTransfer`, imports them and generates the rest. FetchBlocks serves the
pinned blocks and Release unpins them. See docs/disaggregation.md."""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from contextlib import aclosing

import grpc

from kvrouter.engine import SamplingParams
from kvrouter.engine.llm_engine import default_hash_tokens
from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.proto_gen import worker_pb2 as wpb
from kvrouter.proto_gen import worker_pb2_grpc
from kvrouter.worker.config import WorkerConfig
from kvrouter.worker.convert import (
    FINISH_REASONS,
    kv_layout,
    layout_message,
    prompt_tokens,
    request_stats,
    sampling_params,
)
from kvrouter.worker.engine_loop import EngineFailure, EngineLoop, RequestHandle
from kvrouter.worker.leases import LeaseTable
from kvrouter.worker.transfer import KvTransfer, TransferError, block_chunks


@dataclasses.dataclass
class Identity:
    """Who this worker is to the router and its peers (known once registered)."""

    worker_id: int
    address: str
    role: str


class _Pins:
    """Blocks pinned for one hand-off on the decode side; used only on the
    engine thread, so pinning and releasing never race."""

    def __init__(self) -> None:
        self.block_ids: list[int] = []

    def pin(self, engine, block_ids: list[int]) -> list[int]:
        pinned = engine.pin_blocks(block_ids)
        self.block_ids += pinned
        return pinned

    def release(self, engine) -> None:
        if self.block_ids:
            engine.unpin_blocks(self.block_ids)
            self.block_ids = []


def _import(engine, tokens: list[int], blocks, pins: _Pins) -> None:
    engine.import_blocks(tokens, blocks)
    pins.pin(engine, blocks.block_ids)


async def _abort_for(context, error: Exception, what: str) -> None:
    if isinstance(error, EngineFailure):
        code = grpc.StatusCode.INTERNAL
    elif isinstance(error, ValueError):
        code = grpc.StatusCode.INVALID_ARGUMENT
    elif isinstance(error, LookupError):
        code = grpc.StatusCode.NOT_FOUND
    else:
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
    await context.abort(code, f"{what}: {error}")


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
        self.transfer = transfer
        self.config = config
        self.identity = identity
        self.layout = engine.engine.kv_layout
        self._hash = default_hash_tokens(config.block_size, config.namespace)
        self._ids = itertools.count()
        self._id_prefix = os.urandom(3).hex()

    def _parse(self, request: gen.GenerateRequest) -> tuple[list[int], SamplingParams, str]:
        prompt = prompt_tokens(request)
        params = sampling_params(request.sampling)
        if request.namespace != self.config.namespace:
            raise ValueError(
                f"namespace {request.namespace!r} does not match this worker's "
                f"{self.config.namespace!r}"
            )
        request_id = request.request_id or f"{self._id_prefix}-{next(self._ids)}"
        return prompt, params, request_id

    async def _start(self, context, prompt, params, request_id, **hooks) -> RequestHandle:
        try:
            return await self.engine.add_request(prompt, params, request_id, **hooks)
        except ValueError as e:
            await _abort_for(context, e, "request refused")

    async def _next(self, context, handle: RequestHandle):
        item = await handle.outputs.get()
        if isinstance(item, Exception):
            await _abort_for(context, item, "generation failed")
        return item

    async def _tokens(self, context, handle, request_id, prompt_len, extra_output=0, handoff=None):
        """Streams a running request's tokens; aborts it if the stream ends early."""
        finished = False
        try:
            while not finished:
                output = await self._next(context, handle)
                finished = output.finished
                response = gen.GenerateResponse(
                    request_id=request_id,
                    token_ids=output.new_token_ids,
                    decode_worker=self.identity.worker_id,
                )
                if finished:
                    seq = handle.seq
                    response.finish_reason = FINISH_REASONS[output.finish_reason]
                    stats = request_stats(
                        seq.timings,
                        prompt_len,
                        seq.num_cached_tokens,
                        seq.num_output_tokens + extra_output,
                    )
                    if handoff is not None:
                        stats.disaggregated = True
                        stats.handoff.CopyFrom(handoff)
                    response.stats.CopyFrom(stats)
                yield response
        finally:
            if not finished:
                self.engine.abort(request_id)

    # -- aggregated

    async def Generate(self, request, context):
        try:
            prompt, params, request_id = self._parse(request)
        except ValueError as e:
            await _abort_for(context, e, "bad request")
        handle = await self._start(context, prompt, params, request_id)
        async with aclosing(self._tokens(context, handle, request_id, len(prompt))) as tokens:
            async for response in tokens:
                yield response

    # -- disaggregated: the prefill side

    async def Prefill(self, request, context):
        try:
            prompt, params, request_id = self._parse(request.request)
        except ValueError as e:
            await _abort_for(context, e, "bad request")
        if self.leases.get(request_id) is not None:
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS, f"request {request_id!r} already holds a hand-off"
            )
        needs_decode = params.max_tokens > 1

        def pin(engine, seq) -> None:
            # On the engine thread, as the prefill finishes: nothing can evict
            # the blocks between the step that filled them and this pin.
            if needs_decode and seq.finish_reason != "stop":
                self.leases.add(request_id, engine.pin_blocks(engine.block_ids(prompt)))

        first_only = dataclasses.replace(params, max_tokens=1)
        handle = await self._start(context, prompt, first_only, request_id, on_finish=pin)
        finished = False
        try:
            while not finished:
                finished = (await self._next(context, handle)).finished
        finally:
            if not finished:
                # Queued behind the abort: drops the lease if the prefill
                # finished before the abort reached the engine thread.
                self.engine.abort(request_id)
                self.engine.post(self._drop_lease, request_id)
        seq = handle.seq
        lease = self.leases.get(request_id)
        block_ids = lease.block_ids if lease is not None else []
        response = wpb.PrefillResponse(
            handoff=wpb.HandoffDescriptor(
                request_id=request_id,
                prefill_worker=self.identity.worker_id,
                prefill_address=self.identity.address,
                block_ids=block_ids,
                seq_hashes=block_ids,
                num_tokens=len(prompt),
                first_token=seq.output_token_ids[0],
                layout=layout_message(self.layout),
                lease_ms=self.config.lease_ms,
            ),
            stats=request_stats(seq.timings, len(prompt), seq.num_cached_tokens, 1),
        )
        if lease is None:
            response.finish_reason = FINISH_REASONS[seq.finish_reason]
        return response

    def _drop_lease(self, engine, request_id: str) -> None:
        lease = self.leases.take(request_id)
        if lease is not None:
            engine.unpin_blocks(lease.block_ids)

    async def FetchBlocks(self, request, context):
        if not request.block_ids:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "block_ids is empty")

        def export(engine):
            lease = self.leases.get(request.request_id)
            if lease is None:
                raise LookupError(
                    f"no pinned hand-off for request {request.request_id!r} "
                    "(released, expired or never prefilled here)"
                )
            leased = set(lease.block_ids)
            unknown = [b for b in request.block_ids if b not in leased]
            if unknown:
                raise ValueError(f"{len(unknown)} blocks are not part of the hand-off")
            return engine.export_blocks(list(request.block_ids))

        try:
            blocks = await self.engine.call(export)
        except (LookupError, ValueError) as e:
            await _abort_for(context, e, "cannot serve blocks")
        chunk_bytes = min(
            request.max_chunk_bytes or self.config.max_chunk_bytes, self.config.max_chunk_bytes
        )
        for chunk in block_chunks(blocks, chunk_bytes):
            yield chunk

    async def Release(self, request, context):
        if not await self.leases.release(request.request_id, "released"):
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no pinned hand-off for request {request.request_id!r} "
                "(already released, or its lease expired)",
            )
        return wpb.ReleaseResponse()

    # -- disaggregated: the decode side

    def _check_handoff(self, prompt: list[int], params: SamplingParams, handoff) -> None:
        if handoff.num_tokens != len(prompt):
            raise ValueError(
                f"the hand-off covers {handoff.num_tokens} tokens, the prompt has {len(prompt)}"
            )
        if params.max_tokens < 2:
            raise ValueError("max_tokens is 1: the prefill's first token completes the request")
        block_ids = list(handoff.block_ids)
        if list(handoff.seq_hashes) != block_ids:
            raise ValueError("the hand-off's seq_hashes and block_ids differ")
        if not block_ids:
            return
        if kv_layout(handoff.layout) != self.layout:
            raise ValueError(
                f"the hand-off's KV layout {kv_layout(handoff.layout)} does not match "
                f"this worker's {self.layout}"
            )
        if self._hash(prompt)[: len(block_ids)] != block_ids:
            raise ValueError(
                "the hand-off's blocks do not match this worker's hashes of the prompt "
                "(another namespace or block size?)"
            )

    def _fetch_timeout(self, context) -> float:
        remaining = context.time_remaining()
        limit = self.config.fetch_timeout_s
        return limit if remaining is None else min(limit, remaining)

    async def Decode(self, request, context):
        handoff = request.handoff
        try:
            prompt, params, request_id = self._parse(request.request)
            self._check_handoff(prompt, params, handoff)
        except ValueError as e:
            await _abort_for(context, e, "bad request")
        tokens = [*prompt, handoff.first_token]
        rest = dataclasses.replace(params, max_tokens=params.max_tokens - 1)
        block_ids = list(handoff.block_ids)
        pins = _Pins()
        started = time.perf_counter()
        try:
            held = await self.engine.call(pins.pin, block_ids)
            missing = block_ids[len(held) :]
            num_bytes = 0
            if missing:
                try:
                    fetched = await self.transfer.fetch(
                        handoff.prefill_address,
                        handoff.request_id,
                        missing,
                        self.layout,
                        self._fetch_timeout(context),
                    )
                except TransferError as e:
                    source = handoff.prefill_address
                    await context.abort(
                        grpc.StatusCode.ABORTED,
                        f"could not fetch the hand-off's blocks from {source}: {e}",
                    )
                num_bytes = fetched.num_bytes
                try:
                    await self.engine.call(_import, tokens, fetched.blocks, pins)
                except (ValueError, RuntimeError) as e:
                    await _abort_for(context, e, "cannot import the hand-off's blocks")
            stats = gen.HandoffStats(
                blocks_reused=len(held),
                blocks_transferred=len(missing),
                bytes_transferred=num_bytes,
                transfer_ms=(time.perf_counter() - started) * 1000.0,
            )
            yield gen.GenerateResponse(
                request_id=request_id, decode_worker=self.identity.worker_id, handoff=stats
            )
            handle = await self._start(context, tokens, rest, request_id, on_scheduled=pins.release)
            stream = self._tokens(
                context, handle, request_id, len(prompt), extra_output=1, handoff=stats
            )
            async with aclosing(stream):
                async for response in stream:
                    yield response
        finally:
            self.engine.post(pins.release)

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
