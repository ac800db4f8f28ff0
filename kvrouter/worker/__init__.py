"""The worker service (`kvrouter worker`): one `LLMEngine` behind the gRPC
Worker service, registered with the router and publishing its KV events.
See docs/disaggregation.md.

Layer: may import `kvrouter.engine`, the client library, `kvrouter.adapters`
(JetStream publishing), `kvrouter.net`, `kvrouter.roles`, `kvrouter._core`
and `kvrouter.proto_gen`; never the service (docs/architecture.md)."""

from kvrouter.worker.config import WorkerConfig
from kvrouter.worker.server import WorkerServer, run
from kvrouter.worker.transfer import GrpcKvTransfer, KvTransfer

__all__ = ["GrpcKvTransfer", "KvTransfer", "WorkerConfig", "WorkerServer", "run"]
