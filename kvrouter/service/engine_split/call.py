"""What a split protocol is given (the contract: __init__.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import grpc

from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.service.openai_worker import EngineClient, EngineTokens
from kvrouter.service.worker_calls import Deadline, RequestFailed, WorkerFailure


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
    prompt: Sequence[int]
    prefill: Engine
    decode: Engine
    deadline: Deadline
    # How long P may take to do its part, and D to send its first token
    # and each one after.
    prefill_s: float
    first_token_s: float
    token_gap_s: float
    prefill_done: Callable[[], None]

    def decode_stream(
        self, extra: dict, alongside_prefill: bool = False
    ) -> AsyncIterator[EngineTokens]:
        """D's streamed answer to the request, with the protocol's `extra`
        fields in its body. `alongside_prefill`: D is called while P still
        works and sends nothing until P is done, so its first token is
        given P's time as well as its own; P's silence is then P's
        failure, never D's."""
        first_token_s = self.first_token_s + (self.prefill_s if alongside_prefill else 0.0)
        return self.engines.generate(
            self.decode.worker_id,
            self.decode.address,
            self.request,
            self.prompt,
            self.deadline,
            first_token_s=first_token_s,
            token_gap_s=self.token_gap_s,
            extra=extra,
        )


async def ask_prefill(call: SplitCall, body: dict) -> dict:
    """P's whole answer to `body`, within the prefill's time. PrefillFailed
    when P fails; the request's own deadline passing stays DEADLINE_EXCEEDED."""
    try:
        return await call.engines.complete(
            call.prefill.worker_id,
            call.prefill.address,
            call.request,
            body,
            call.deadline,
            call.prefill_s,
        )
    except RequestFailed as e:
        if e.code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise
        raise PrefillFailed(e.message) from None
    except WorkerFailure as e:
        raise PrefillFailed(e.message) from None
