"""The router as a gRPC service (`kvrouter serve`): routing, the worker
registry and KV event ingestion over the policy and the Rust prefix index."""

from kvrouter.service.config import ServiceConfig
from kvrouter.service.server import RouterServer, run, serve

__all__ = ["RouterServer", "ServiceConfig", "run", "serve"]
