"""The prefill side of a split request: Prefill computes the first token and
pins the prompt's blocks under a lease; FetchBlocks serves them to the
decode worker; Release (or the lease's TTL) unpins them."""

from __future__ import annotations

import dataclasses

import grpc

from kvrouter.engine import KvLayout
from kvrouter.proto_gen import worker_pb2 as wpb
from kvrouter.worker.convert import (
    FINISH_REASONS,
    layout_message,
    logprobs_message,
    request_stats,
)
from kvrouter.worker.leases import LeaseTable
from kvrouter.worker.requests import Requests, abort_for
from kvrouter.worker.transfer import block_chunks


class PrefillSide:
    def __init__(self, requests: Requests, leases: LeaseTable, layout: KvLayout) -> None:
        self.requests = requests
        self.engine = requests.engine
        self.config = requests.config
        self.identity = requests.identity
        self.leases = leases
        self.layout = layout

    async def prefill(self, request, context):
        try:
            prompt, params, request_id = self.requests.parse(request.request)
        except ValueError as e:
            await abort_for(context, e, "bad request")
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
        handle = await self.requests.start(context, prompt, first_only, request_id, on_finish=pin)
        finished = False
        try:
            while not finished:
                finished = (await self.requests.next(context, handle)).finished
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
        if seq.output_logprobs:
            response.handoff.first_logprobs.CopyFrom(logprobs_message(seq.output_logprobs[0]))
        if lease is None:
            response.finish_reason = FINISH_REASONS[seq.finish_reason]
        return response

    def _drop_lease(self, engine, request_id: str) -> None:
        lease = self.leases.take(request_id)
        if lease is not None:
            engine.unpin_blocks(lease.block_ids)

    async def fetch_blocks(self, request, context):
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
            await abort_for(context, e, "cannot serve blocks")
        chunk_bytes = min(
            request.max_chunk_bytes or self.config.max_chunk_bytes, self.config.max_chunk_bytes
        )
        for chunk in block_chunks(blocks, chunk_bytes):
            yield chunk

    async def release(self, request, context):
        if not await self.leases.release(request.request_id, "released"):
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no pinned hand-off for request {request.request_id!r} "
                "(already released, or its lease expired)",
            )
        return wpb.ReleaseResponse()
