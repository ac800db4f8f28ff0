"""kvrouter: a KV-cache-aware router for disaggregated LLM inference."""

from kvrouter._core import (
    DEFAULT_BLOCK_SIZE,
    ApplyOutcome,
    Cleared,
    OverlapScores,
    PrefixIndex,
    Removed,
    Stored,
    Tier,
    chain_hashes,
    hash_tokens,
    hash_tokens_array,
    local_block_hashes,
    namespace_seed,
)

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "ApplyOutcome",
    "Cleared",
    "OverlapScores",
    "PrefixIndex",
    "Removed",
    "Stored",
    "Tier",
    "chain_hashes",
    "hash_tokens",
    "hash_tokens_array",
    "local_block_hashes",
    "namespace_seed",
]
