"""Splitting a request between two OpenAI-compatible engines that hand KV
cache to each other: a prefill engine P and a decode engine D that
registered the same `kv_transfer` protocol (kvrouter.net.worker_protocol).
One module per protocol: vllm.py (`kv_transfer_params`), sglang.py
(bootstrap). proxied_request.py picks one with `protocol_for` and runs it
once, for the decision's P and D; a retry on another decode engine is
served whole.

The contract of a protocol's `stream(call: SplitCall)`:

- it yields what EngineClient.generate yields for D: (token ids, finish
  reason, log probabilities), the last with its finish reason set;
- it raises PrefillFailed, before yielding anything, when P failed (no
  connection, an error status, silence past `call.prefill_s`, an answer
  without what D needs): the caller then serves the request whole on D.
  Nothing it started on D is left running;
- D's own failures are EngineClient.generate's (WorkerFailure,
  RequestFailed), and so is the request's deadline passing anywhere;
- it calls `call.prefill_done()` once P's part is over, done or failed,
  so that the router closes P's booking;
- closing it closes every connection it opened.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from kvrouter.net.worker_protocol import KV_TRANSFER_SGLANG, KV_TRANSFER_VLLM
from kvrouter.service.engine_split import sglang, vllm
from kvrouter.service.engine_split.call import Engine, PrefillFailed, SplitCall
from kvrouter.service.openai_worker import EngineTokens

__all__ = ["Engine", "PrefillFailed", "SplitCall", "protocol_for"]

Protocol = Callable[[SplitCall], AsyncIterator[EngineTokens]]
PROTOCOLS: dict[str, Protocol] = {KV_TRANSFER_VLLM: vllm.stream, KV_TRANSFER_SGLANG: sglang.stream}


def protocol_for(kv_transfer: str) -> Protocol | None:
    """The `stream` of a registered kv_transfer; None for "none"."""
    return PROTOCOLS.get(kv_transfer)
