"""Drives a workload through the router's proxied Generate with the Python
client: every session concurrently, each session's turns in order, the
model's answers appended to the conversation."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from kvrouter.client.generate import GenerateClient, Generation
from kvrouter.demo.progress import ProgressBar
from kvrouter.demo.workload import Session


@dataclass(frozen=True)
class TurnResult:
    session: str
    turn: int
    prompt_tokens: int
    result: Generation


@dataclass(frozen=True)
class WorkloadRun:
    policy: str
    turns: list[TurnResult]
    wall_s: float


async def run_workload(
    target: str,
    sessions: list[Session],
    policy: str,
    *,
    max_tokens: int = 24,
    progress: bool = True,
) -> WorkloadRun:
    total = sum(len(s.turns) for s in sessions)
    bar = ProgressBar(total, policy) if progress else None
    turns: list[TurnResult] = []
    started = time.perf_counter()
    async with GenerateClient(target) as client:

        async def converse(session: Session) -> None:
            history: list[int] = []
            for index, new_tokens in enumerate(session.turns):
                history += new_tokens
                result = await client.generate(history, max_tokens=max_tokens, ignore_eos=True)
                turns.append(TurnResult(session.name, index + 1, len(history), result))
                history += result.token_ids
                if bar is not None:
                    bar.advance()

        await asyncio.gather(*(converse(s) for s in sessions))
    order = {s.name: i for i, s in enumerate(sessions)}
    turns.sort(key=lambda t: (t.turn, order[t.session]))
    return WorkloadRun(policy, turns, time.perf_counter() - started)
