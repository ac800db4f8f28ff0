"""The kvrouter worker engine: a small paged-attention LLM engine.

Entry point: `LLMEngine` (add_request / step / generate, and the KV hand-off
calls export_blocks / import_blocks). See docs/engine.md.

It reports cache changes to a `kvrouter.events.EventSink`. `KvEventSink`
and `DEVICE_TIER` are the former names of `EventSink` and `Tier.DEVICE`,
kept for one release.

Layer: may import `kvrouter._core`, `kvrouter.events` and
`kvrouter.sampling_rules` only (docs/architecture.md).
"""

from kvrouter.engine.config import EngineConfig, ModelConfig
from kvrouter.engine.handoff import KvBlocks, KvLayout
from kvrouter.engine.llm_engine import Completion, EngineLoad, LLMEngine, RequestOutput
from kvrouter.engine.sampling_params import SamplingParams
from kvrouter.events import EventSink, NullEventSink, Tier

KvEventSink = EventSink
DEVICE_TIER = Tier.DEVICE

__all__ = [
    "DEVICE_TIER",
    "Completion",
    "EngineConfig",
    "EngineLoad",
    "EventSink",
    "KvBlocks",
    "KvEventSink",
    "KvLayout",
    "LLMEngine",
    "ModelConfig",
    "NullEventSink",
    "RequestOutput",
    "SamplingParams",
]
