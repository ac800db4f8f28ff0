"""Trace replay: simulated workers on virtual time, driven by the same
routing policy the service uses, against baseline policies.

`kvrouter replay --help` runs it; docs/routing.md describes the timing model.

Layer: may import `kvrouter.policy` and `kvrouter._core` only
(docs/architecture.md)."""

from kvrouter.replay.simulator import ReplayConfig, replay, replay_requests
from kvrouter.replay.timing import TimingModel
from kvrouter.replay.trace import TraceRequest, load_mooncake

__all__ = [
    "ReplayConfig",
    "TimingModel",
    "TraceRequest",
    "load_mooncake",
    "replay",
    "replay_requests",
]
