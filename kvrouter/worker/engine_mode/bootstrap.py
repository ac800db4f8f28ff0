"""SGLang's disaggregation bootstrap, on the worker's own KV transfer: what
a router in SGLang's load-balancer role (service/engine_split/sglang.py)
drives. P and D are sent the request at once, each with P's
`bootstrap_host` and `bootstrap_port` (here P's HTTP port) and one
`bootstrap_room`; which side a worker plays is its role.

- Prefill: the request runs for one token (SGLang's prefill server only
  prefills); when it finishes, its prompt's blocks are pinned under the
  room's lease, as a vLLM hand-off is (handoff.py), and the room is done.
- Decode: asks P's `GET /bootstrap/{room}`, which answers once P's part is
  done with the hand-off's `kv_transfer_params` (vLLM's shape), then
  fetches the blocks as a vLLM decode does. P failing, gone, or not done
  within the fetch timeout: the prompt is prefilled here, the same answer.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp
from starlette.requests import Request
from starlette.responses import JSONResponse

from kvrouter.worker.engine_mode.handoff import Handoffs

log = logging.getLogger("kvrouter.worker.engine_mode.bootstrap")
ROOM_BITS = 63


@dataclass(frozen=True)
class Bootstrap:
    """The bootstrap fields of a request."""

    host: str
    port: int
    room: int

    @classmethod
    def parse(cls, body: dict) -> Bootstrap | None:
        """None without a `bootstrap_room`; ValueError names what is wrong."""
        room = body.get("bootstrap_room")
        if room is None:
            return None
        host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
        if type(room) is not int or not 0 <= room < 2**ROOM_BITS:
            raise ValueError(f"bootstrap_room must be an integer in [0, 2^{ROOM_BITS})")
        if not isinstance(host, str) or not host or type(port) is not int:
            raise ValueError("bootstrap_host and bootstrap_port name the prefill engine")
        return cls(host, port, room)

    @property
    def lease(self) -> str:
        """The name P pins the room's blocks under."""
        return f"bootstrap-room-{self.room}"


class Rooms:
    """P's side: each room's hand-off, for D's bootstrap request to wait on.
    A room is kept `keep_s` from when either side first names it."""

    def __init__(self, handoffs: Handoffs) -> None:
        self.handoffs = handoffs
        self.keep_s = handoffs.fetch_timeout_s
        self._rooms: dict[int, asyncio.Future] = {}

    def finished(self, bootstrap: Bootstrap, done: bool) -> None:
        """P's part ended: done (its blocks pinned) or not."""
        future = self._room(bootstrap.room)
        if not future.done():
            future.set_result(self.handoffs.answer(bootstrap.lease) if done else None)

    async def route(self, request: Request) -> JSONResponse:
        """`GET /bootstrap/{room}`: the room's kv_transfer_params once P's
        part is done; 404 if it fails or is not done in time."""
        room = request.path_params["room"]
        try:
            params = await asyncio.wait_for(asyncio.shield(self._room(room)), self.keep_s)
        except TimeoutError:
            params = None
        if params is None:
            return JSONResponse({"error": f"no hand-off for room {room}"}, status_code=404)
        return JSONResponse(params)

    def _room(self, room: int) -> asyncio.Future:
        future = self._rooms.get(room)
        if future is None:
            loop = asyncio.get_running_loop()
            future = self._rooms[room] = loop.create_future()
            loop.call_later(self.keep_s, self._rooms.pop, room, None)
        return future


async def ask_prefill(bootstrap: Bootstrap, timeout_s: float) -> dict[str, Any] | None:
    """D's side: P's kv_transfer_params for the room; None (logged) when P
    cannot say."""
    url = f"http://{bootstrap.host}:{bootstrap.port}/bootstrap/{bootstrap.room}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http:
            async with http.get(url) as response:
                if response.status == 200:
                    return await response.json()
                error = f"HTTP {response.status}"
    except (aiohttp.ClientError, TimeoutError) as e:
        error = str(e) or type(e).__name__
    log.warning(
        "no hand-off from the prefill engine's bootstrap; prefilling",
        extra={"fields": {"room": bootstrap.room, "url": url, "error": error}},
    )
    return None
