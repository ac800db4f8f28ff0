"""The worker's KV events as vLLM 0.33's `ZmqEventPublisher` sends them.

A PUB socket carries `[topic, seq (8-byte big-endian), payload]`, the
payload a msgpack `[ts, events, data_parallel_rank]` (msgspec positional)
whose events are tagged maps with defaults left out, as vLLM's msgspec
structs encode them. A ROUTER socket answers `[identity, b"", start_seq]`
with `[identity, b"", topic, seq, payload]` for every buffered batch from
`start_seq` on, then `[identity, b"", b"", -1 (signed), b""]`.

Unlike vLLM, which binds only wildcard endpoints and connects to the rest,
both sockets always bind: the worker is the server its subscribers dial.
Block hashes are the engine's block ids, which the sidecar treats as opaque.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import msgspec
import zmq

from kvrouter.events import Cleared, Event, EventSink, Removed, Stored, Tier

log = logging.getLogger("kvrouter.worker.engine_mode.kv_events")

END_SEQ = (-1).to_bytes(8, "big", signed=True)
# vLLM's `medium` for each tier.
MEDIUMS = {Tier.DEVICE: "GPU", Tier.HOST: "CPU", Tier.DISK: "STORAGE"}
# How often the publisher thread looks at the replay socket while idle.
POLL_S = 0.05


class _Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _Event(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(_Event):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(_Event):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(_Event):
    pass


def vllm_event(event: Event, block_size: int) -> _Event:
    match event:
        case Stored():
            return BlockStored(
                block_hashes=list(event.block_ids),
                parent_block_hash=event.parent,
                token_ids=list(event.token_ids),
                block_size=block_size,
                lora_id=None,
                medium=MEDIUMS[event.tier],
                lora_name=None,
            )
        case Removed():
            return BlockRemoved(block_hashes=list(event.block_ids), medium=MEDIUMS[event.tier])
        case Cleared():
            return AllBlocksCleared()
    raise TypeError(f"not a KV event: {event!r}")


class ZmqEventPublisher(EventSink):
    """An event sink (thread-safe) that publishes each `emit` as one batch
    from a thread of its own; `close()` stops it."""

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str = "",
        *,
        block_size: int,
        buffer_steps: int = 10_000,
        topic: str = "",
        data_parallel_rank: int = 0,
    ) -> None:
        self.block_size = block_size
        self.data_parallel_rank = data_parallel_rank
        self._topic = topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._queue: queue.SimpleQueue[list[Event] | None] = queue.SimpleQueue()
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay = None
        # Where the sockets are bound (a `tcp://HOST:*` endpoint picks a free port).
        self.endpoint = self.replay_endpoint = ""
        # The endpoint being bound: an OSError's `filename` when it fails.
        binding = endpoint
        try:
            self._pub.bind(endpoint)
            self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
            if replay_endpoint:
                binding = replay_endpoint
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
                self._replay.bind(replay_endpoint)
                self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as e:
            self._ctx.destroy(linger=0)
            raise OSError(e.errno, f"cannot bind: {e.strerror.lower()}", binding) from None
        self._encoder = msgspec.msgpack.Encoder()
        self._next_seq = 0
        self._thread = threading.Thread(target=self._run, name="kv-events-zmq", daemon=True)
        self._thread.start()

    def emit(self, events: Iterable[Event]) -> None:
        events = list(events)
        if events:
            self._queue.put(events)

    def close(self) -> None:
        """Publishes what was emitted, then closes the sockets."""
        self._queue.put(None)
        self._thread.join()
        self._ctx.destroy(linger=0)

    def _run(self) -> None:
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._answer_replay()
            try:
                events = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if events is None:
                return
            try:
                self._publish(events)
            except Exception:
                log.exception("publishing KV events failed")

    def _publish(self, events: list[Event]) -> None:
        batch = _Batch(
            time.time(),
            [vllm_event(e, self.block_size) for e in events],
            self.data_parallel_rank,
        )
        payload = self._encoder.encode(batch)
        seq = self._next_seq
        self._next_seq += 1
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))

    def _answer_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            log.warning("malformed replay request", extra={"fields": {"frames": len(frames)}})
            return
        identity, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in self._buffer:
            if seq >= start_seq:
                self._replay.send_multipart(
                    (identity, b"", self._topic, seq.to_bytes(8, "big"), payload)
                )
        self._replay.send_multipart((identity, b"", b"", END_SEQ, b""))
