"""Prompts and request builders shared by the worker and disaggregation tests."""

from __future__ import annotations

import random

from kvrouter.proto_gen import generation_pb2 as gen

BLOCK = 16


def prompt(seed: int, length: int, vocab: int = 256) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(length)]


def request(tokens: list[int], max_tokens: int, request_id: str = "", **sampling):
    return gen.GenerateRequest(
        request_id=request_id,
        tokens=tokens,
        sampling=gen.SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling),
    )


def collect(stream) -> tuple[list[int], list]:
    """All tokens of a GenerateResponse stream, and its messages."""
    messages = list(stream)
    return [t for m in messages for t in m.token_ids], messages


def idle(status) -> bool:
    """Nothing running, nothing pinned, no lease."""
    return (
        status.running_requests == 0
        and status.waiting_requests == 0
        and status.leases == 0
        and status.blocks_in_use == 0
    )
