"""`GenerateClient`: proxied generation through the router (asyncio).

    async with GenerateClient("127.0.0.1:50051") as client:
        result = await client.generate(prompt_tokens, max_tokens=64)
        result.token_ids, result.prefill_worker, result.stats.ttft_ms

`stream()` yields the tokens as they come. Failures raise RouterError
subclasses (InvalidArgument, Unavailable, DeadlineExceeded, ...)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

import grpc

from kvrouter.client.convert import encode_tokens, rpc_error
from kvrouter.net.channels import CHANNEL_OPTIONS, aio_channel
from kvrouter.net.credentials import Credentials
from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.proto_gen import router_pb2_grpc

FINISH_REASONS = {
    gen.FINISH_REASON_STOP: "stop",
    gen.FINISH_REASON_LENGTH: "length",
    gen.FINISH_REASON_CANCELLED: "cancelled",
}


@dataclass(frozen=True)
class GenerationStats:
    """Timings in ms as the router streamed the tokens; the hand-off's figures
    when the request was disaggregated."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    queue_ms: float = 0.0
    prefill_ms: float = 0.0
    ttft_ms: float = 0.0
    mean_itl_ms: float = 0.0
    max_itl_ms: float = 0.0
    disaggregated: bool = False
    blocks_reused: int = 0
    blocks_transferred: int = 0
    bytes_transferred: int = 0
    transfer_ms: float = 0.0
    retries: int = 0

    @classmethod
    def from_message(cls, s: gen.RequestStats) -> GenerationStats:
        h = s.handoff
        return cls(
            s.prompt_tokens,
            s.cached_tokens,
            s.output_tokens,
            s.queue_ms,
            s.prefill_ms,
            s.ttft_ms,
            s.mean_itl_ms,
            s.max_itl_ms,
            s.disaggregated,
            h.blocks_reused,
            h.blocks_transferred,
            h.bytes_transferred,
            h.transfer_ms,
            s.retries,
        )


@dataclass(frozen=True)
class TokenLogprobs:
    """A generated token's log probability (of the model's raw logits), and
    the `top` most likely tokens' as (token id, log probability), most
    likely first."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    @classmethod
    def from_message(cls, m: gen.TokenLogprobs) -> TokenLogprobs:
        return cls(m.logprob, tuple(zip(m.top_token_ids, m.top_logprobs, strict=True)))


@dataclass(frozen=True)
class GenerationChunk:
    request_id: str
    token_ids: list[int]
    prefill_worker: int | None
    decode_worker: int
    # Set on the last chunk only.
    finish_reason: str | None = None
    stats: GenerationStats | None = None
    # One per token when the request asked for log probabilities.
    logprobs: list[TokenLogprobs] = field(default_factory=list)


@dataclass
class Generation:
    request_id: str = ""
    token_ids: list[int] = field(default_factory=list)
    prefill_worker: int | None = None
    decode_worker: int = 0
    finish_reason: str | None = None
    stats: GenerationStats = field(default_factory=GenerationStats)
    logprobs: list[TokenLogprobs] = field(default_factory=list)


class GenerateClient:
    def __init__(
        self,
        target: str,
        *,
        model: str = "",
        namespace: str = "",
        timeout: float | None = 120.0,
        channel: grpc.aio.Channel | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self._channel = channel or aio_channel(target, credentials, CHANNEL_OPTIONS)
        self._router = router_pb2_grpc.RouterStub(self._channel)
        self.model = model
        self.namespace = namespace
        self.timeout = timeout

    async def stream(
        self,
        tokens,
        *,
        max_tokens: int = 16,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        ignore_eos: bool = False,
        stop_token_ids: Iterable[int] = (),
        request_id: str = "",
        timeout: float | None = None,
        logprobs: int | None = None,
    ) -> AsyncIterator[GenerationChunk]:
        """The request's chunks as the router streams them. `logprobs`: each
        token's log probability with that many most likely tokens' (0-20);
        None for none."""
        sampling = gen.SamplingParams(
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            max_tokens=max_tokens,
            stop_token_ids=list(stop_token_ids),
            ignore_eos=ignore_eos,
        )
        if seed is not None:
            sampling.seed = seed
        if logprobs is not None:
            sampling.logprobs = logprobs
        request = gen.GenerateRequest(
            request_id=request_id,
            tokens_u32le=encode_tokens(tokens),
            namespace=self.namespace,
            model=self.model,
            sampling=sampling,
        )
        call = self._router.Generate(request, timeout=self.timeout if timeout is None else timeout)
        try:
            async for message in call:
                yield GenerationChunk(
                    message.request_id,
                    list(message.token_ids),
                    message.prefill_worker if message.HasField("prefill_worker") else None,
                    message.decode_worker,
                    FINISH_REASONS.get(message.finish_reason),
                    GenerationStats.from_message(message.stats)
                    if message.HasField("stats")
                    else None,
                    [TokenLogprobs.from_message(m) for m in message.logprobs],
                )
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        finally:
            call.cancel()

    async def generate(self, tokens, **kwargs) -> Generation:
        """Runs one request to the end; takes `stream()`'s arguments."""
        result = Generation()
        async for chunk in self.stream(tokens, **kwargs):
            result.request_id = chunk.request_id
            result.token_ids += chunk.token_ids
            result.logprobs += chunk.logprobs
            result.prefill_worker = chunk.prefill_worker
            result.decode_worker = chunk.decode_worker
            if chunk.finish_reason is not None:
                result.finish_reason = chunk.finish_reason
                result.stats = chunk.stats or GenerationStats()
        return result

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> GenerateClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
