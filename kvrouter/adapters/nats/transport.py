"""The JetStream stream as a publisher transport (`kvrouter.events`).

The stream takes every batch it is sent, so a link's first reply says how
far the stream holds the worker's batches (a resync from there when that is
not where the publisher is), and each batch the stream stored is
acknowledged. A failed publish closes the link: the publisher reconnects and
sends again what the stream does not hold."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from nats.js import JetStreamContext

from kvrouter.adapters.nats.config import NatsConfig
from kvrouter.adapters.nats.publisher import next_seq_in_stream, publish_batch
from kvrouter.events import WorkerBatch
from kvrouter.events.transport import Hello, LinkClosed, Reply


class _StreamLink:
    def __init__(self, js: JetStreamContext, config: NatsConfig, first: Reply) -> None:
        self.js = js
        self.config = config
        self._replies: asyncio.Queue[Reply] = asyncio.Queue()
        self._replies.put_nowait(first)

    async def send(self, batch: WorkerBatch) -> None:
        try:
            await publish_batch(self.js, self.config, batch)
        except Exception as e:  # the stream is unreachable: the batch stays buffered
            raise LinkClosed(f"publishing batch {batch.seq} failed: {e!r}") from None
        self._replies.put_nowait(Reply(batch.seq + 1))

    async def replies(self) -> AsyncIterator[Reply]:
        while True:
            yield await self._replies.get()


class JetStreamTransport:
    def __init__(self, js: JetStreamContext, config: NatsConfig) -> None:
        self.js = js
        self.config = config

    @contextlib.asynccontextmanager
    async def connect(self, hello: Hello) -> AsyncIterator[_StreamLink]:
        try:
            held = await next_seq_in_stream(self.js, self.config, hello.worker_id)
        except Exception as e:
            raise LinkClosed(f"reading the stream failed: {e!r}") from None
        yield _StreamLink(self.js, self.config, Reply(held, resync=held != hello.next_seq))
