"""A kvrouter engine worker's KV events, published straight to the JetStream
stream: the `EventPublisher` over `JetStreamTransport`, the replica
deployment's counterpart of `kvrouter.client.KvEventPublisher`."""

from __future__ import annotations

from nats.js import JetStreamContext

from kvrouter.adapters.nats.config import NatsConfig
from kvrouter.adapters.nats.transport import JetStreamTransport
from kvrouter.events import EventPublisher


class JetStreamWorkerPublisher(EventPublisher):
    """`EventPublisher(JetStreamTransport(js, config), worker_id, ...)`; the
    same options as `EventPublisher`. `await start()`, `await stop()`."""

    def __init__(self, js: JetStreamContext, config: NatsConfig, worker_id: int, **options) -> None:
        super().__init__(JetStreamTransport(js, config), worker_id, **options)
