"""The decode side of a split request: check the hand-off against this
worker's own hashes of the prompt, pin the prefix already cached here, fetch
only the missing blocks through the KvTransfer, import them, acknowledge,
then generate the rest."""

from __future__ import annotations

import dataclasses
import time
from contextlib import aclosing

import grpc

from kvrouter.engine import KvLayout, SamplingParams
from kvrouter.engine.llm_engine import default_hash_tokens
from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.worker.convert import kv_layout
from kvrouter.worker.requests import Requests, abort_for
from kvrouter.worker.transfer import KvTransfer, TransferError


class Pins:
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


def import_pinned(engine, tokens: list[int], blocks, pins: Pins) -> None:
    engine.import_blocks(tokens, blocks)
    pins.pin(engine, blocks.block_ids)


class DecodeSide:
    def __init__(self, requests: Requests, transfer: KvTransfer, layout: KvLayout) -> None:
        self.requests = requests
        self.engine = requests.engine
        self.config = requests.config
        self.identity = requests.identity
        self.transfer = transfer
        self.layout = layout
        self._hash = default_hash_tokens(self.config.block_size, self.config.hash_namespace)

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

    async def decode(self, request, context):
        handoff = request.handoff
        try:
            prompt, params, request_id = self.requests.parse(request.request)
            self._check_handoff(prompt, params, handoff)
        except ValueError as e:
            await abort_for(context, e, "bad request")
        tokens = [*prompt, handoff.first_token]
        rest = dataclasses.replace(params, max_tokens=params.max_tokens - 1)
        block_ids = list(handoff.block_ids)
        pins = Pins()
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
                    await self.engine.call(import_pinned, tokens, fetched.blocks, pins)
                except (ValueError, RuntimeError) as e:
                    await abort_for(context, e, "cannot import the hand-off's blocks")
            stats = gen.HandoffStats(
                blocks_reused=len(held),
                blocks_transferred=len(missing),
                bytes_transferred=num_bytes,
                transfer_ms=(time.perf_counter() - started) * 1000.0,
            )
            yield gen.GenerateResponse(
                request_id=request_id, decode_worker=self.identity.worker_id, handoff=stats
            )
            handle = await self.requests.start(
                context, tokens, rest, request_id, on_scheduled=pins.release
            )
            stream = self.requests.tokens(
                context, handle, request_id, len(prompt), extra_output=1, handoff=stats
            )
            async with aclosing(stream):
                async for response in stream:
                    yield response
        finally:
            self.engine.post(pins.release)
