"""Worker batches into the JetStream stream, on the worker's own subject.

`JetStreamSink` is the sink of a bridge that relays engines' batches
(`kvrouter.adapters.vllm`) with the engines' own numbers;
`kvrouter.adapters.nats.transport` carries an `EventPublisher`'s batches.
Both write and read the stream through the two calls here."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from kvrouter.adapters.nats.codec import decode_batch, encode_batch
from kvrouter.adapters.nats.config import NatsConfig
from kvrouter.events import WorkerBatch


async def publish_batch(js: JetStreamContext, config: NatsConfig, batch: WorkerBatch) -> None:
    # No Nats-Msg-Id dedup: a restarted worker legitimately numbers its
    # batches from 0 again; replicas drop true duplicates by number.
    await js.publish(
        config.event_subject(batch.worker_id), encode_batch(batch), stream=config.stream
    )


async def next_seq_in_stream(js: JetStreamContext, config: NatsConfig, worker_id: int) -> int:
    """The batch number after the worker's last one in the stream (0 for none)."""
    try:
        last = await js.get_last_msg(config.stream, config.event_subject(worker_id))
    except NotFoundError:
        return 0
    return decode_batch(last.data).seq + 1


class JetStreamSink:
    """A `BatchSink` whose batches every router replica consumes. One
    publisher per worker: the stream's order is the worker's order. A
    restarted bridge continues each worker's stream where the last one left
    it."""

    def __init__(self, js: JetStreamContext, config: NatsConfig) -> None:
        self.js = js
        self.config = config
        self._next: dict[int, int] = {}

    async def next_seq(self, worker_id: int) -> int:
        if worker_id not in self._next:
            self._next[worker_id] = await next_seq_in_stream(self.js, self.config, worker_id)
        return self._next[worker_id]

    async def deliver(self, batch: WorkerBatch) -> None:
        await publish_batch(self.js, self.config, batch)
        self._next[batch.worker_id] = batch.seq + 1
