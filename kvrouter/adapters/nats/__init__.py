"""Worker batches over NATS JetStream, for several router replicas.

Bridges from vLLM/SGLang engines (`EngineBridge`) and kvrouter workers
(`JetStreamWorkerPublisher`) publish worker batches to one stream
(`JetStreamSink`, `ensure_stream`) that every router replica consumes
(`kvrouter.service.replicas`). The single-router default needs none of this.

`IndexReplica` and `RouterReplica` moved to `kvrouter.service.replicas`;
importing them from here still works for one release. (`SharedLoadRouter` is
gone: replicas share bookings through the core's load book, see
`kvrouter.service.replicas.BookingExchange`.)
"""

from kvrouter.adapters.nats.bridge import EngineBridge
from kvrouter.adapters.nats.config import NatsConfig
from kvrouter.adapters.nats.publisher import JetStreamSink
from kvrouter.adapters.nats.stream import ensure_stream
from kvrouter.adapters.nats.worker_publisher import JetStreamWorkerPublisher

__all__ = [
    "EngineBridge",
    "JetStreamSink",
    "JetStreamWorkerPublisher",
    "NatsConfig",
    "ensure_stream",
]

_MOVED_TO_SERVICE = frozenset({"IndexReplica", "RouterReplica"})


def __getattr__(name: str):
    # Imported on first use: the replicas import this package's transport.
    if name in _MOVED_TO_SERVICE:
        from kvrouter.service import replicas

        return getattr(replicas, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
