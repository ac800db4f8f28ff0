"""What a split protocol is given (the contract: __init__.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.service.openai_worker import EngineClient
from kvrouter.service.worker_calls import Deadline


class PrefillFailed(Exception):
    """P did not do its part; D can still serve the request whole."""


@dataclass(frozen=True)
class Engine:
    worker_id: int
    address: str
    # SGLang's bootstrap port on the address's host (0: none).
    bootstrap_port: int = 0


@dataclass
class SplitCall:
    engines: EngineClient
    request: gen.GenerateRequest
    prompt: list[int]
    prefill: Engine
    decode: Engine
    deadline: Deadline
    # How long P may take to do its part, and D to send its first token
    # and each one after.
    prefill_s: float
    first_token_s: float
    token_gap_s: float
    prefill_done: Callable[[], None]
