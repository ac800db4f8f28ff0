"""Routing policy: pick the worker(s) with the lowest predicted time to first token.

The service and the replay simulator drive the same `Router`. Scoring and the
load book live in the Rust core (`kvrouter._core`); this package owns the
configuration, the worker registry glue and the explanation of each decision.
"""

from kvrouter.policy.config import PolicyConfig
from kvrouter.policy.decision import CandidateCost, Decision, NoWorkerAvailable
from kvrouter.policy.router import Router

__all__ = ["CandidateCost", "Decision", "NoWorkerAvailable", "PolicyConfig", "Router"]
