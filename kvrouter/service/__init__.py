"""The router as a gRPC service (`kvrouter serve`): routing, the worker
registry and KV event ingestion over the policy and the Rust prefix index.

Layer: may import `kvrouter.policy`, `kvrouter.net`, `kvrouter.roles`,
`kvrouter._core` and `kvrouter.proto_gen`; never the client library, the workers, the adapters or
`replicas`, which builds on this package (docs/architecture.md)."""

from kvrouter.service.config import ServiceConfig
from kvrouter.service.server import RouterServer, run, serve

__all__ = ["RouterServer", "ServiceConfig", "run", "serve"]
