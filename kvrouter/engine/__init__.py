"""The kvrouter worker engine: a small paged-attention LLM engine.

Entry point: `LLMEngine` (add_request / step / generate, and the KV hand-off
calls export_blocks / import_blocks). See docs/engine.md.

Layer: may import `kvrouter._core` only (docs/architecture.md).
"""

from kvrouter.engine.config import EngineConfig, ModelConfig
from kvrouter.engine.events import DEVICE_TIER, KvEventSink, NullEventSink
from kvrouter.engine.handoff import KvBlocks, KvLayout
from kvrouter.engine.llm_engine import Completion, EngineLoad, LLMEngine, RequestOutput
from kvrouter.engine.sampling_params import SamplingParams

__all__ = [
    "DEVICE_TIER",
    "Completion",
    "EngineConfig",
    "EngineLoad",
    "KvBlocks",
    "KvEventSink",
    "KvLayout",
    "LLMEngine",
    "ModelConfig",
    "NullEventSink",
    "RequestOutput",
    "SamplingParams",
]
