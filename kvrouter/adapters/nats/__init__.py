"""Several router replicas on NATS JetStream.

Bridges from vLLM/SGLang engines (`EngineBridge`) and kvrouter workers
(`JetStreamWorkerPublisher`) publish worker batches to one stream
(`JetStreamSink`); every replica consumes it durably into its own index
(`IndexReplica`), resuming from its snapshot and stream position after a
restart; replicas share their routing decisions (`SharedLoadRouter`).
`RouterReplica` puts the three together. The single-router default needs
none of this.
"""

from kvrouter.adapters.nats.bridge import EngineBridge
from kvrouter.adapters.nats.config import NatsConfig
from kvrouter.adapters.nats.load_share import SharedLoadRouter
from kvrouter.adapters.nats.publisher import JetStreamSink
from kvrouter.adapters.nats.replica import IndexReplica
from kvrouter.adapters.nats.router_replica import RouterReplica
from kvrouter.adapters.nats.stream import ensure_stream
from kvrouter.adapters.nats.worker_publisher import JetStreamWorkerPublisher

__all__ = ["EngineBridge", "IndexReplica", "JetStreamSink", "JetStreamWorkerPublisher",
           "NatsConfig", "RouterReplica", "SharedLoadRouter", "ensure_stream"]
