"""The worker service (`kvrouter worker`): one `LLMEngine` behind the gRPC
Worker service, registered with the router and publishing its KV events.
See docs/disaggregation.md."""

from kvrouter.worker.config import WorkerConfig
from kvrouter.worker.server import WorkerServer, run
from kvrouter.worker.transfer import GrpcKvTransfer, KvTransfer

__all__ = ["GrpcKvTransfer", "KvTransfer", "WorkerConfig", "WorkerServer", "run"]
