"""KV events from vLLM and SGLang engines over ZMQ.

`EngineSubscriber` subscribes to each configured engine's PUB socket
(`config.load_engines`), decodes both encodings vLLM has shipped (`wire`),
converts them to engine-neutral events (`convert`), keeps each worker's
stream gap-free through the engine's replay socket (`ordering`, `replay`) and
delivers the batches to a sink: the local index (`IndexSink`) or JetStream.
"""

from kvrouter.adapters.vllm.config import EngineConfig, load_engines, stable_worker_id
from kvrouter.adapters.vllm.discovery import register_engines
from kvrouter.adapters.vllm.subscriber import EngineSubscriber

__all__ = ["EngineConfig", "EngineSubscriber", "load_engines", "register_engines",
           "stable_worker_id"]
