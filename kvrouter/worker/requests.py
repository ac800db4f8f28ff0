"""What every Worker RPC shares: parsing a GenerateRequest, starting it on
the engine thread, and streaming its tokens back; and how engine errors map
onto gRPC status codes."""

from __future__ import annotations

import dataclasses
import itertools
import os

import grpc

from kvrouter.engine import SamplingParams
from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.worker.config import WorkerConfig
from kvrouter.worker.convert import (
    FINISH_REASONS,
    logprobs_message,
    prompt_tokens,
    request_stats,
    sampling_params,
)
from kvrouter.worker.engine_loop import EngineFailure, EngineLoop, RequestHandle, SequenceFailed


@dataclasses.dataclass
class Identity:
    """Who this worker is to the router and its peers (known once registered)."""

    worker_id: int
    address: str
    role: str


async def abort_for(context, error: Exception, what: str) -> None:
    if isinstance(error, EngineFailure):
        code = grpc.StatusCode.INTERNAL
    elif isinstance(error, SequenceFailed):
        # Caused by this request: the router does not retry it elsewhere.
        code = grpc.StatusCode.FAILED_PRECONDITION
    elif isinstance(error, ValueError):
        code = grpc.StatusCode.INVALID_ARGUMENT
    elif isinstance(error, LookupError):
        code = grpc.StatusCode.NOT_FOUND
    else:
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
    await context.abort(code, f"{what}: {error}")


class Requests:
    def __init__(self, engine: EngineLoop, config: WorkerConfig, identity: Identity) -> None:
        self.engine = engine
        self.config = config
        self.identity = identity
        self._ids = itertools.count()
        self._id_prefix = os.urandom(3).hex()

    def parse(self, request: gen.GenerateRequest) -> tuple[list[int], SamplingParams, str]:
        """Prompt, sampling and request id; ValueError names what is wrong."""
        prompt = prompt_tokens(request)
        params = sampling_params(request.sampling)
        if request.model != self.config.served_model_name:
            raise ValueError(
                f"model {request.model!r} is not the one this worker serves, "
                f"{self.config.served_model_name!r}"
            )
        if request.namespace != self.config.namespace:
            raise ValueError(
                f"namespace {request.namespace!r} does not match this worker's "
                f"{self.config.namespace!r}"
            )
        request_id = request.request_id or f"{self._id_prefix}-{next(self._ids)}"
        return prompt, params, request_id

    async def start(self, context, prompt, params, request_id, **hooks) -> RequestHandle:
        try:
            return await self.engine.add_request(prompt, params, request_id, **hooks)
        except ValueError as e:
            await abort_for(context, e, "request refused")

    async def next(self, context, handle: RequestHandle):
        item = await handle.outputs.get()
        if isinstance(item, Exception):
            await abort_for(context, item, "generation failed")
        return item

    async def tokens(self, context, handle, request_id, prompt_len, extra_output=0, handoff=None):
        """Streams a running request's tokens; aborts it if the stream ends early."""
        finished = False
        try:
            while not finished:
                output = await self.next(context, handle)
                finished = output.finished
                response = gen.GenerateResponse(
                    request_id=request_id,
                    token_ids=output.new_token_ids,
                    decode_worker=self.identity.worker_id,
                )
                if output.new_logprobs:
                    response.logprobs.extend(map(logprobs_message, output.new_logprobs))
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
