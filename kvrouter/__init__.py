"""kvrouter: a KV-cache-aware router for disaggregated LLM inference.

`Tier` is `kvrouter.events.Tier`, the Python side's one tier type; the
core's `Stored` and `Removed` take it (or its name) as their tier.
"""

from kvrouter._core import (
    DEFAULT_BLOCK_SIZE,
    ApplyOutcome,
    Cleared,
    EndsReusable,
    OverlapScores,
    PrefixIndex,
    Removed,
    Stored,
    chain_hashes,
    hash_tokens,
    hash_tokens_array,
    local_block_hashes,
    model_namespace,
    namespace_seed,
)
from kvrouter.events.tier import Tier

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "ApplyOutcome",
    "Cleared",
    "EndsReusable",
    "OverlapScores",
    "PrefixIndex",
    "Removed",
    "Stored",
    "Tier",
    "chain_hashes",
    "hash_tokens",
    "hash_tokens_array",
    "local_block_hashes",
    "model_namespace",
    "namespace_seed",
]
