"""Publishes worker batches to the JetStream stream: the sink of a bridge
that subscribes to engines (`kvrouter.adapters.vllm`) or of a worker
sidecar."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from kvrouter.adapters.events import WorkerBatch
from kvrouter.adapters.nats.codec import decode_batch, encode_batch
from kvrouter.adapters.nats.config import NatsConfig


class JetStreamSink:
    """An `EventSink` whose batches every router replica consumes. One
    publisher per worker: the stream's order is the worker's order."""

    def __init__(self, js: JetStreamContext, config: NatsConfig) -> None:
        self.js = js
        self.config = config
        self._next: dict[int, int] = {}

    async def next_seq(self, worker_id: int) -> int:
        if worker_id not in self._next:
            self._next[worker_id] = await self._continue_after_last(worker_id)
        return self._next[worker_id]

    async def deliver(self, batch: WorkerBatch) -> None:
        # No Nats-Msg-Id dedup: a restarted engine legitimately numbers its
        # batches from 0 again; replicas drop true duplicates by number.
        await self.js.publish(self.config.event_subject(batch.worker_id), encode_batch(batch),
                              stream=self.config.stream)
        self._next[batch.worker_id] = batch.seq + 1

    async def _continue_after_last(self, worker_id: int) -> int:
        """A restarted publisher continues the worker's stream where the
        last one left it."""
        try:
            last = await self.js.get_last_msg(self.config.stream,
                                              self.config.event_subject(worker_id))
        except NotFoundError:
            return 0
        return decode_batch(last.data).seq + 1
