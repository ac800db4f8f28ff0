"""Protobuf messages to and from the engine's types, with input validation
(a ValueError names the bad field)."""

from __future__ import annotations

import numpy as np

from kvrouter.engine import KvLayout, SamplingParams
from kvrouter.engine.sampler import TokenLogprobs
from kvrouter.engine.sequence import RequestTimings
from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.proto_gen import worker_pb2 as wpb
from kvrouter.sampling_rules import wire_top_p

FINISH_REASONS = {
    "stop": gen.FINISH_REASON_STOP,
    "length": gen.FINISH_REASON_LENGTH,
    "abort": gen.FINISH_REASON_CANCELLED,
}


def prompt_tokens(request: gen.GenerateRequest) -> list[int]:
    if request.tokens_u32le:
        if len(request.tokens):
            raise ValueError("set only one of tokens and tokens_u32le")
        packed = request.tokens_u32le
        if len(packed) % 4:
            raise ValueError(f"tokens_u32le has {len(packed)} bytes, not a multiple of 4")
        tokens = np.frombuffer(packed, dtype="<u4").tolist()
    else:
        tokens = list(request.tokens)
    if not tokens:
        raise ValueError("the prompt is empty")
    return tokens


def sampling_params(sampling: gen.SamplingParams) -> SamplingParams:
    return SamplingParams(
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=wire_top_p(sampling.top_p),
        top_k=sampling.top_k,
        seed=sampling.seed if sampling.HasField("seed") else None,
        ignore_eos=sampling.ignore_eos,
        stop_token_ids=tuple(sampling.stop_token_ids),
        logprobs=sampling.logprobs if sampling.HasField("logprobs") else None,
    )


def logprobs_message(found: TokenLogprobs) -> gen.TokenLogprobs:
    return gen.TokenLogprobs(
        logprob=found.logprob,
        top_token_ids=[token for token, _ in found.top],
        top_logprobs=[logprob for _, logprob in found.top],
    )


def layout_message(layout: KvLayout) -> wpb.KvLayout:
    return wpb.KvLayout(
        num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim,
        block_size=layout.block_size,
        dtype=layout.dtype,
        tp_rank=0,
        tp_size=1,
    )


def kv_layout(message: wpb.KvLayout) -> KvLayout:
    return KvLayout(
        message.num_layers,
        message.block_size,
        message.num_kv_heads,
        message.head_dim,
        message.dtype,
    )


def _ms(seconds: float | None) -> float:
    return 0.0 if seconds is None else seconds * 1000.0


def request_stats(
    timings: RequestTimings, prompt_tokens: int, cached_tokens: int, output_tokens: int
) -> gen.RequestStats:
    gaps = timings.inter_token_latencies
    return gen.RequestStats(
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        output_tokens=output_tokens,
        queue_ms=_ms(timings.queue_time),
        prefill_ms=_ms(timings.prefill_time),
        ttft_ms=_ms(timings.ttft),
        mean_itl_ms=_ms(timings.mean_itl),
        max_itl_ms=_ms(max(gaps, default=None)),
    )
