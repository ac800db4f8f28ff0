"""The worker service (`kvrouter worker`): one `LLMEngine` behind the gRPC
Worker service, registered with the router and publishing its KV events.
See docs/disaggregation.md.

Layer: may import `kvrouter.engine`, the client library, `kvrouter.adapters`
(JetStream publishing), `kvrouter.net`, `kvrouter.roles`, `kvrouter._core`
and `kvrouter.proto_gen`; never the service (docs/architecture.md)."""

from kvrouter.worker.config import WorkerConfig

__all__ = ["GrpcKvTransfer", "KvTransfer", "WorkerConfig", "WorkerServer", "run"]


def __getattr__(name: str):
    # The server and the transfer load torch and the engine: imported on
    # first use, so that a configuration can be checked without them.
    if name in ("WorkerServer", "run"):
        from kvrouter.worker import server

        return getattr(server, name)
    if name in ("GrpcKvTransfer", "KvTransfer"):
        from kvrouter.worker import transfer

        return getattr(transfer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
