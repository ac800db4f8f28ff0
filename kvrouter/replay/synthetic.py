"""A synthetic multi-turn chat and agent workload, as Mooncake-style records.

- Chat sessions: each starts from one of a few shared system prompts; every
  turn appends the user's message and the previous answer, so turn k's
  prompt extends turn k-1's.
- Agents: each agent has a long private tool/instruction prefix and issues
  bursts of short calls on top of its growing scratchpad.

Sessions arrive as a Poisson process, or in on/off bursts (`bursts`); turns
within one are separated by a think time. Hash ids are allocated so equal
ids mean equal prefixes."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from kvrouter.replay.trace import TraceRequest


@dataclass
class WorkloadShape:
    num_requests: int = 2000
    sessions_per_s: float = 1.0
    agent_fraction: float = 0.3
    system_prompts: int = 4
    # Each system prompt's length, drawn once from this range of blocks.
    system_prompt_blocks: tuple[int, int] = (8, 8)
    turns: tuple[int, int] = (2, 8)
    user_blocks: tuple[int, int] = (1, 6)
    answer_tokens: tuple[int, int] = (50, 400)
    think_time_s: tuple[float, float] = (5.0, 60.0)
    agent_prefix_blocks: tuple[int, int] = (16, 48)
    agent_calls: tuple[int, int] = (4, 16)
    agent_gap_s: tuple[float, float] = (0.5, 4.0)
    # On and off periods (s): sessions arrive in the on periods only, as
    # fast as it takes to keep `sessions_per_s` on average. None: steadily.
    bursts: tuple[float, float] | None = None


def generate(
    shape: WorkloadShape, trace_block_size: int = 512, seed: int = 0
) -> list[TraceRequest]:
    rng = random.Random(seed)
    ids = itertools.count()
    systems = [
        [next(ids) for _ in range(_draw(rng, shape.system_prompt_blocks))]
        for _ in range(shape.system_prompts)
    ]
    on_s, off_s = shape.bursts or (1.0, 0.0)
    rate = shape.sessions_per_s * (on_s + off_s) / on_s
    out: list[TraceRequest] = []
    on_time = 0.0
    while len(out) < shape.num_requests:
        on_time += rng.expovariate(rate)
        # Seconds of on periods to wall time: each is followed by an off one.
        start = on_time * 1000
        if shape.bursts is not None:
            start = (on_time // on_s * (on_s + off_s) + on_time % on_s) * 1000
        agent = rng.random() < shape.agent_fraction
        if agent:
            context = [next(ids) for _ in range(rng.randint(*shape.agent_prefix_blocks))]
            calls, gap = rng.randint(*shape.agent_calls), shape.agent_gap_s
            step_blocks = (1, 2)
        else:
            context = list(rng.choice(systems))
            calls, gap = rng.randint(*shape.turns), shape.think_time_s
            step_blocks = shape.user_blocks
        t = start
        for _ in range(calls):
            context += [next(ids) for _ in range(rng.randint(*step_blocks))]
            out.append(
                TraceRequest(
                    t,
                    len(context) * trace_block_size,
                    rng.randint(*shape.answer_tokens),
                    tuple(context),
                )
            )
            # The answer joins the context of the next turn.
            context += [next(ids)]
            t += rng.uniform(*gap) * 1000
    out.sort(key=lambda r: r.arrival_ms)
    return out[: shape.num_requests]


def _draw(rng: random.Random, bounds: tuple[int, int]) -> int:
    """A number in `bounds`; a fixed one draws nothing, so that workloads
    written before ranges existed come out as they did."""
    low, high = bounds
    return low if low == high else rng.randint(low, high)
