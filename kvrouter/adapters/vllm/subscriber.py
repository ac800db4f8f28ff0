"""Subscribes to engines' KV event PUB sockets and feeds a sink.

One SUB socket per DP-rank publisher, read by its own task, so batch numbers
stay per publisher. Messages are `[topic, seq, payload]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter

import zmq
import zmq.asyncio

from kvrouter.adapters.sink import BatchSink
from kvrouter.adapters.vllm.config import EngineConfig, Stream
from kvrouter.adapters.vllm.convert import EventConverter
from kvrouter.adapters.vllm.ordering import StreamSequencer
from kvrouter.adapters.vllm.replay import fetch_replay

log = logging.getLogger(__name__)


class EngineSubscriber:
    """Delivers every configured engine's batches to `sink`, each worker's in
    order and without gaps. Use as `async with EngineSubscriber(...)`."""

    def __init__(
        self,
        engines: list[EngineConfig],
        sink: BatchSink,
        *,
        block_size: int,
        replay_idle_timeout_s: float = 1.0,
        probe_interval_s: float = 1.0,
    ) -> None:
        self.engines = engines
        self.sink = sink
        self.block_size = block_size
        self.replay_idle_timeout_s = replay_idle_timeout_s
        # A quiet stream asks the replay socket for what it missed this often.
        self.probe_interval_s = probe_interval_s
        # batches, gaps, replays, resyncs, restarts, malformed, unknown_event:<tag>
        self.stats: Counter[str] = Counter()
        self.converters: dict[str, EventConverter] = {}
        self._ctx: zmq.asyncio.Context | None = None
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        if self._ctx is not None:
            raise RuntimeError("already started")
        self._ctx = zmq.asyncio.Context()
        for engine in self.engines:
            converter = EventConverter(
                self.block_size,
                engine.namespace,
                model=engine.model,
                attention_chunk_size=engine.attention_chunk_size,
            )
            self.converters[engine.name] = converter
            for stream in engine.streams:
                sock = self._ctx.socket(zmq.SUB)
                sock.setsockopt(zmq.LINGER, 0)
                sock.subscribe(engine.topic.encode())
                sock.connect(stream.endpoint)
                sequencer = StreamSequencer(stream, converter, self.sink, self._replay, self.stats)
                self._tasks.append(
                    asyncio.create_task(
                        self._read(stream, sock, sequencer), name=f"kv-events {stream.endpoint}"
                    )
                )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    async def __aenter__(self) -> EngineSubscriber:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def _read(
        self, stream: Stream, sock: zmq.asyncio.Socket, sequencer: StreamSequencer
    ) -> None:
        try:
            await self._guarded(stream, sequencer.probe())
            while True:
                if not await sock.poll(self.probe_interval_s * 1000):
                    await self._guarded(stream, sequencer.probe())
                    continue
                frames = await sock.recv_multipart()
                if len(frames) < 2 or len(frames[-2]) != 8:
                    self.stats["bad_frames"] += 1
                    continue
                seq = int.from_bytes(frames[-2], "big")
                await self._guarded(stream, sequencer.on_message(seq, frames[-1]))
        finally:
            sock.close()

    async def _guarded(self, stream: Stream, step) -> None:
        """One bad batch or a failing sink must not end the stream: what was
        not delivered shows up as a gap later and is repaired then."""
        try:
            await step
        except Exception:
            self.stats["errors"] += 1
            log.exception(
                "handling KV events failed", extra={"fields": {"endpoint": stream.endpoint}}
            )

    async def _replay(self, endpoint: str, start_seq: int) -> tuple[dict[int, bytes], bool]:
        return await fetch_replay(self._ctx, endpoint, start_seq, self.replay_idle_timeout_s)
