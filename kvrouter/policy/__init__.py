"""Routing policy: where each request goes, and the load it books there.

The decision is made in one place, the Rust core's `routing::Router`
(`kvrouter._core.Router`): hashing, the index lookup, the policy, the load
book, predictions, the decision's stats and its log record. The service, the
replay and router replicas all route through it. `PolicyConfig` holds every
setting with its default, defined once in the core; `policy` names the
policy that decides ("kvrouter", or a baseline: "round_robin", "random",
"least_loaded", "overlap_only", "dynamo").

May import: `kvrouter._core` only.
"""

from kvrouter._core import (
    Booking,
    Candidate,
    Decision,
    Explanation,
    NoWorkerAvailable,
    PolicyConfig,
    Router,
    UnknownModel,
)

POLICIES: tuple[str, ...] = tuple(PolicyConfig.policies())

CandidateCost = Candidate
"""Deprecated alias of `Candidate`, kept for one release."""

__all__ = [
    "POLICIES",
    "Booking",
    "Candidate",
    "CandidateCost",
    "Decision",
    "Explanation",
    "NoWorkerAvailable",
    "PolicyConfig",
    "Router",
    "UnknownModel",
]
