"""Worker ids shared by the router replicas of one deployment.

A worker in front of replicas registers with one (which may assign its id)
and then with the others under that id. Were each replica to count on its
own, two workers joining at two replicas could get the same id, and the
second to reach a replica would take the first's place there. So the
replicas share one counter, in a JetStream key-value bucket: each reserves
a block of ids at a time by a compare-and-set update of the bucket's next
free id, and hands out its block alone, stepping over ids in use (ones
workers picked themselves) as the single router's counter does.

The replica's snapshot keeps the end of its last block, and a reservation
never starts below it: an id is not handed out again after a restart, even
with the bucket lost (if a snapshot was written since the last
reservation). NATS unreachable when a block runs out refuses the
registration with UNAVAILABLE, which workers retry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Container

import grpc
import nats.errors
from nats.aio.client import Client
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from kvrouter.adapters.nats.config import NatsConfig
from kvrouter.service.errors import ServiceError
from kvrouter.service.replicas.replica import IndexReplica
from kvrouter.service.worker_ids import MAX_WORKER_ID, IdBlock, exhausted

# The bucket's one key: the first id no replica has reserved.
_NEXT = "next"
# Ids per reservation: a registration in a hundred waits on NATS.
BLOCK_IDS = 100
# Within the 5 s a worker gives its Register call, so that it sees
# UNAVAILABLE (and retries) rather than its own deadline.
NATS_TIMEOUT_S = 2.0


async def id_bucket(nc: Client, config: NatsConfig) -> KeyValue:
    """The deployment's id bucket, created by the first replica to start."""
    js = nc.jetstream(timeout=NATS_TIMEOUT_S)
    try:
        return await js.key_value(config.id_bucket)
    except BucketNotFoundError:
        return await js.create_key_value(
            KeyValueConfig(
                bucket=config.id_bucket,
                history=1,
                storage=StorageType.FILE,
                replicas=config.stream_replicas,
            )
        )


class SharedIdCounter:
    """A replica's ids, in blocks reserved from the shared bucket. The end
    of its last block is `events.next_worker_id`, which the replica's
    snapshot keeps (and restores)."""

    def __init__(self, bucket: KeyValue, events: IndexReplica, block_ids: int = BLOCK_IDS) -> None:
        self.bucket = bucket
        self.events = events
        self.block_ids = block_ids
        self._block = IdBlock(events.next_worker_id, events.next_worker_id)
        # One reservation at a time: concurrent registrations share its block.
        self._lock = asyncio.Lock()

    @property
    def next_unused(self) -> int:
        return self._block.end

    async def take(self, in_use: Callable[[], Container[int]]) -> int:
        async with self._lock:
            while (worker_id := self._block.take(in_use())) is None:
                self._block = await self._reserve()
            return worker_id

    async def _reserve(self) -> IdBlock:
        while True:
            try:
                try:
                    entry = await self.bucket.get(_NEXT)
                    start, revision = int(entry.value), entry.revision
                except KeyNotFoundError:
                    start, revision = 1, 0
                start = max(start, self._block.end)
                if start > MAX_WORKER_ID:
                    raise exhausted()
                end = min(start + self.block_ids, MAX_WORKER_ID + 1)
                await self.bucket.update(_NEXT, str(end).encode(), last=revision)
                self.events.next_worker_id = end
                return IdBlock(start, end)
            except KeyWrongLastSequenceError:
                continue  # another replica reserved a block meanwhile
            except nats.errors.Error as e:
                raise ServiceError(
                    grpc.StatusCode.UNAVAILABLE,
                    "worker ids are shared between router replicas through NATS, which "
                    f"did not answer ({type(e).__name__}: {e}); register again later",
                ) from None
