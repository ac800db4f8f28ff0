"""SGLang's disaggregation bootstrap, as its own load balancer drives it:
P and D are sent the request at once, each with P's `bootstrap_host` and
`bootstrap_port` and one random 63-bit `bootstrap_room` that pairs them.
D waits for P's blocks on that room, then streams every token; P's own
answer (not streamed) only says that it is done, and is read and dropped.

P failing before D's first token means D has no KV to decode from: D's
call is closed (SGLang aborts it) and the request is served whole. After
D's first token, P's fate no longer matters."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from kvrouter.service.engine_split.call import PrefillFailed, SplitCall, ask_prefill
from kvrouter.service.openai_worker import EngineTokens, completion_body
from kvrouter.service.worker_calls import RequestFailed

ROOM_BITS = 63


def bootstrap(call: SplitCall) -> dict:
    """The fields both engines are sent: P's bootstrap address, a fresh room."""
    host = urlsplit(call.prefill.address).hostname
    return {
        # As a URL writes an IPv6 host, which SGLang's bootstrap expects.
        "bootstrap_host": f"[{host}]" if ":" in host else host,
        "bootstrap_port": call.prefill.bootstrap_port,
        "bootstrap_room": secrets.randbits(ROOM_BITS),
    }


async def stream(call: SplitCall) -> AsyncIterator[EngineTokens]:
    fields = bootstrap(call)
    prefill = asyncio.ensure_future(_prefill(call, fields))
    prefill.add_done_callback(lambda _: call.prefill_done())
    tokens = call.decode_stream(fields, alongside_prefill=True)
    try:
        first = asyncio.ensure_future(anext(tokens))
        while not first.done():
            waiting = {first} if prefill.done() else {first, prefill}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if not first.done() and prefill.exception() is not None:
                first.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await first
                error = prefill.exception()
                if isinstance(error, RequestFailed):
                    raise error
                raise PrefillFailed(str(error))
        yield first.result()
        async for chunk in tokens:
            yield chunk
    finally:
        prefill.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await prefill
        await tokens.aclose()


async def _prefill(call: SplitCall, fields: dict) -> None:
    """P's part; PrefillFailed when it fails."""
    body = {**completion_body(call.request, call.prompt), "stream": False, **fields}
    await ask_prefill(call, body)
