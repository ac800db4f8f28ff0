"""KV events from vLLM and SGLang engines over ZMQ.

`EngineSubscriber` subscribes to each configured engine's PUB socket
(`config.load_engines`), decodes both encodings vLLM has shipped (`wire`),
converts them to `kvrouter.events` (`convert`), keeps each worker's stream
gap-free through the engine's replay socket (`ordering`, `replay`) and
delivers the batches to a `BatchSink`: the local index (`IndexSink`),
JetStream (`JetStreamSink`) or the router's event stream (the sidecar's
publishers).
"""

from kvrouter.adapters.vllm.config import EngineConfig, load_engines, stable_worker_id
from kvrouter.adapters.vllm.discovery import register_engines
from kvrouter.adapters.vllm.subscriber import EngineSubscriber

__all__ = [
    "EngineConfig",
    "EngineSubscriber",
    "load_engines",
    "register_engines",
    "stable_worker_id",
]
