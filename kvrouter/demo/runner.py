"""Drives a workload through the router's proxied Generate with the Python
client: sessions concurrently (started a little apart), each session's turns
in order, the model's answers appended to the conversation."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from tqdm import tqdm

from kvrouter.client.generate import GenerateClient, Generation, GenerationStats
from kvrouter.demo.workload import Session


@dataclass(frozen=True)
class TurnResult:
    session: str
    turn: int
    prompt_tokens: int
    result: Generation
    # As the client saw them: first token, and second token (after the hand-off).
    client_ttft_ms: float
    client_second_token_ms: float


@dataclass(frozen=True)
class WorkloadRun:
    policy: str
    turns: list[TurnResult]
    wall_s: float


async def _generate(client: GenerateClient, tokens: list[int], max_tokens: int):
    result = Generation()
    started = time.perf_counter()
    times: list[float] = []
    async for chunk in client.stream(tokens, max_tokens=max_tokens, ignore_eos=True):
        now = time.perf_counter()
        times += [now] * len(chunk.token_ids)
        result.request_id = chunk.request_id
        result.token_ids += chunk.token_ids
        result.prefill_worker = chunk.prefill_worker
        result.decode_worker = chunk.decode_worker
        if chunk.finish_reason is not None:
            result.finish_reason = chunk.finish_reason
            result.stats = chunk.stats or GenerationStats()
    ttft = (times[0] - started) * 1000.0
    second = (times[1] - started) * 1000.0 if len(times) > 1 else ttft
    return result, ttft, second


async def run_workload(
    target: str,
    sessions: list[Session],
    policy: str,
    *,
    max_tokens: int = 24,
    progress: bool = True,
    stagger_s: float = 0.03,
) -> WorkloadRun:
    """Session i starts `i * stagger_s` after the first: users arrive one after
    another, not in one synchronized burst."""
    total = sum(len(s.turns) for s in sessions)
    bar = tqdm(total=total, desc=f"  {policy}", unit="turn", disable=not progress, leave=True)
    turns: list[TurnResult] = []
    started = time.perf_counter()
    async with GenerateClient(target) as client:

        async def converse(start_s: float, session: Session) -> None:
            await asyncio.sleep(start_s)
            history: list[int] = []
            for index, new_tokens in enumerate(session.turns):
                history += new_tokens
                result, ttft, second = await _generate(client, history, max_tokens)
                turns.append(
                    TurnResult(session.name, index + 1, len(history), result, ttft, second)
                )
                history += result.token_ids
                bar.update()

        await asyncio.gather(*(converse(i * stagger_s, s) for i, s in enumerate(sessions)))
    bar.close()
    order = {s.name: i for i, s in enumerate(sessions)}
    turns.sort(key=lambda t: (t.turn, order[t.session]))
    return WorkloadRun(policy, turns, time.perf_counter() - started)
