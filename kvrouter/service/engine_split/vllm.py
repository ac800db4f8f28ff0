"""vLLM's disaggregated prefill (NixlConnector, P2P connectors), as its
own proxy drives it: P is sent the request whole (not streamed) with
`max_tokens` 1 and `kv_transfer_params` asking for a remote decode; its
answer's `kv_transfer_params` (where and which blocks to pull: remote
host, port, engine id, block ids) go to D with the request, streamed. D
pulls the blocks and generates every token, the first included, so a
greedy answer is the one D alone would give. Both calls carry the
request's id (`X-Request-Id`), which vLLM's connectors pair them by.

P keeps the blocks until D has pulled them or its own timeout lapses
(vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT); the protocol has no release."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from kvrouter.service.engine_split.call import PrefillFailed, SplitCall, ask_prefill
from kvrouter.service.openai_worker import EngineTokens, completion_body

# What P is asked for: its prefill kept for a decode elsewhere.
REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


async def stream(call: SplitCall) -> AsyncIterator[EngineTokens]:
    params = await _prefill(call)
    tokens = call.decode_stream({"kv_transfer_params": params})
    async with aclosing(tokens):
        async for chunk in tokens:
            yield chunk


async def _prefill(call: SplitCall) -> dict:
    """P's kv_transfer_params for D."""
    body = {
        **completion_body(call.request, call.prompt),
        "stream": False,
        "max_tokens": 1,
        "kv_transfer_params": REMOTE_DECODE,
    }
    try:
        answer = await ask_prefill(call, body)
    finally:
        call.prefill_done()
    params = answer.get("kv_transfer_params")
    if not isinstance(params, dict) or not params:
        raise PrefillFailed("the prefill engine answered without kv_transfer_params")
    return params
