"""Several router replicas on NATS JetStream.

Every replica consumes the event stream durably into its own index
(`IndexReplica`), resuming from its snapshot and stream position after a
restart; replicas share their routing decisions (`BookingExchange`).
`RouterReplica` puts the two together and `ReplicaServer` serves one over
the router's gRPC API (`kvrouter serve --nats`). The NATS transport itself
(stream, codec, publishers) is `kvrouter.adapters.nats`. The single-router
default needs none of this.

Layer: may import the rest of `kvrouter.service`, `kvrouter.adapters` (the
NATS transport), `kvrouter.policy`, `kvrouter.net`, `kvrouter.roles`,
`kvrouter._core` and `kvrouter.proto_gen` (docs/architecture.md).
"""

from kvrouter.service.replicas.load_share import BookingExchange
from kvrouter.service.replicas.replica import IndexReplica
from kvrouter.service.replicas.replica_server import ReplicaServer
from kvrouter.service.replicas.router_replica import RouterReplica

__all__ = ["BookingExchange", "IndexReplica", "ReplicaServer", "RouterReplica"]
