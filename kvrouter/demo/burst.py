"""Why prefill and decode run apart: a few long-running streams decode
while a burst of long prompts arrives. With disaggregation the burst
prefills on the prefill workers, and the streams' time between tokens
barely moves; on workers that do both, each prefill chunk is computed in
the same engine steps as the streams' next tokens, which wait for it."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from kvrouter.client.generate import GenerateClient

STREAMS = 4
STREAM_PROMPT_TOKENS = 64
STREAM_MAX_TOKENS = 400
# Tokens each stream decodes before the burst is sent.
WARM_TOKENS = 8
BURST = 6
BURST_PROMPT_TOKENS = 1_200


@dataclass(frozen=True)
class BurstRun:
    # The streams' gaps between tokens (ms) while the burst was prefilled:
    # from its start until its last request's first token.
    gaps_ms: list[float]
    burst_ttft_ms: list[float]


def _tokens(rng: random.Random, count: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(count)]


async def run_burst(target: str, *, seed: int = 0, vocab: int = 256) -> BurstRun:
    rng = random.Random(seed)
    warm = asyncio.Event()
    warmed = 0
    stamps: list[list[float]] = [[] for _ in range(STREAMS)]

    async with GenerateClient(target) as client:

        async def stream(index: int) -> None:
            nonlocal warmed
            prompt = _tokens(rng, STREAM_PROMPT_TOKENS, vocab)
            async for chunk in client.stream(prompt, max_tokens=STREAM_MAX_TOKENS, ignore_eos=True):
                stamps[index] += [time.perf_counter()] * len(chunk.token_ids)
                if len(stamps[index]) >= WARM_TOKENS > len(stamps[index]) - len(chunk.token_ids):
                    warmed += 1
                    if warmed == STREAMS:
                        warm.set()

        async def burst_request(prompt: list[int], sent: float) -> float:
            async for _ in client.stream(prompt, max_tokens=2, ignore_eos=True):
                return (time.perf_counter() - sent) * 1000.0
            return 0.0

        streams = [asyncio.create_task(stream(i)) for i in range(STREAMS)]
        await warm.wait()
        prompts = [_tokens(rng, BURST_PROMPT_TOKENS, vocab) for _ in range(BURST)]
        sent = time.perf_counter()
        ttfts = await asyncio.gather(*(burst_request(p, sent) for p in prompts))
        ended = sent + max(ttfts) / 1000.0
        await asyncio.gather(*streams)

    gaps = [
        (b - a) * 1000.0
        for times in stamps
        for a, b in zip(times, times[1:], strict=False)
        if sent <= b <= ended and b > a
    ]
    return BurstRun(gaps, list(ttfts))
