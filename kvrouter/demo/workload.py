"""The demo's workload: multi-turn chats that share a system prompt, and
agents that share a tool description and append tool output at every step.
Token ids are random (the demo model has random weights); what matters is
which prefixes repeat."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Session:
    name: str
    # What each turn appends to the conversation (the model's answers are
    # appended between turns as they come).
    turns: list[list[int]]


def _tokens(rng: random.Random, count: int, vocab: int) -> list[int]:
    # Ids 0-2 are left out: tokenizers keep them for BOS/EOS/padding.
    return [rng.randrange(3, vocab) for _ in range(count)]


def build_workload(
    *,
    chats: int = 4,
    agents: int = 2,
    chat_turns: int = 3,
    agent_steps: int = 4,
    vocab: int = 256,
    seed: int = 0,
) -> list[Session]:
    rng = random.Random(seed)
    system_prompt = _tokens(rng, 160, vocab)
    tool_spec = _tokens(rng, 480, vocab)
    sessions = []
    for i in range(chats):
        first = system_prompt + _tokens(rng, rng.randrange(480, 960), vocab)
        follow_ups = [_tokens(rng, rng.randrange(24, 64), vocab) for _ in range(chat_turns - 1)]
        sessions.append(Session(f"chat-{i + 1}", [first, *follow_ups]))
    for i in range(agents):
        task = tool_spec + _tokens(rng, 64, vocab)
        tool_outputs = [_tokens(rng, rng.randrange(96, 240), vocab) for _ in range(agent_steps - 1)]
        sessions.append(Session(f"agent-{i + 1}", [task, *tool_outputs]))
    return sessions
