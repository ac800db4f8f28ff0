"""Asks an engine's ROUTER replay socket for the batches a subscriber missed.

The request is `[b"", start_seq]` from a DEALER (the engine sees
`[identity, b"", start_seq]`); the engine answers with one `[b"", seq,
payload]` message per buffered batch from `start_seq` on, then
`[b"", -1, b""]`. A fresh socket per request keeps late answers to an
abandoned request from mixing into the next one.
"""

from __future__ import annotations

import zmq
import zmq.asyncio

END_OF_REPLAY = -1


async def fetch_replay(
    ctx: zmq.asyncio.Context, endpoint: str, start_seq: int, idle_timeout_s: float
) -> tuple[dict[int, bytes], bool]:
    """Payloads by batch number, as far as the engine's buffer reaches, and
    whether the engine answered to the end (it gives up when the engine stays
    silent for `idle_timeout_s`)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    batches: dict[int, bytes] = {}
    answered = False
    try:
        await sock.send_multipart([b"", start_seq.to_bytes(8, "big")])
        while await sock.poll(idle_timeout_s * 1000):
            frames = await sock.recv_multipart()
            if len(frames) < 2:
                continue
            seq = int.from_bytes(frames[-2], "big", signed=True)
            if seq == END_OF_REPLAY:
                answered = True
                break
            batches[seq] = frames[-1]
    finally:
        sock.close()
    return batches, answered
