"""KV events on the Python side: one model, one sink interface, one publisher.

- `Tier`, `Stored`, `Removed`, `EndsReusable`, `Cleared`, `WorkerBatch`
  (`model`, `tier`): plain frozen data that mirrors the core's index events;
- `EventSink` (`sink`): what engines report to (`stored`, `removed`,
  `cleared`) and what forwarding code hands events to (`emit`);
- `EventPublisher` (`publisher`): batches, numbers and delivers a worker's
  events over a `Transport` (`transport`): the router's gRPC stream or the
  replicas' JetStream stream.

Conversions live at the edges: to the core's types (`core`), to and from
protobuf (`proto`), and msgpack for NATS (`kvrouter.adapters.nats.codec`).

Layer: may import `kvrouter._core` and `kvrouter.proto_gen` only
(docs/architecture.md).
"""

from kvrouter.events.model import Cleared, EndsReusable, Event, Removed, Stored, WorkerBatch
from kvrouter.events.publisher import EventPublisher
from kvrouter.events.sink import EventList, EventSink, NullEventSink
from kvrouter.events.tier import Tier

__all__ = [
    "Cleared",
    "EndsReusable",
    "Event",
    "EventList",
    "EventPublisher",
    "EventSink",
    "NullEventSink",
    "Removed",
    "Stored",
    "Tier",
    "WorkerBatch",
]
