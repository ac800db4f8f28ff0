"""Type stubs for kvrouter._core, the Rust core (hashing and the prefix index)."""

import array
import enum
from collections.abc import Iterable, Sequence
from typing import Any

DEFAULT_BLOCK_SIZE: int

# Token ids: list[int], array('I'), a 1-D numpy uint32/int32/int64 array, or
# little-endian uint32 bytes. Buffers are read in place, without a copy.
Tokens = Any
# Block hashes: a sequence of ints in [0, 2**64) or a numpy uint64/int64 array.
Hashes = Sequence[int] | Any

def hash_tokens(tokens: Tokens, block_size: int = 16, namespace: str = "") -> list[int]:
    """Chained sequence hashes of the full blocks; a partial tail is not hashed."""

def hash_tokens_array(
    tokens: Tokens, block_size: int = 16, namespace: str = ""
) -> array.array[int]:
    """`hash_tokens` as array('Q'): no Python int per hash; `find_matches`
    reads it in place."""

def local_block_hashes(tokens: Tokens, block_size: int = 16, namespace: str = "") -> list[int]:
    """xxh3-64 of each full block's little-endian bytes, seeded by the namespace."""

def chain_hashes(local_hashes: Sequence[int], parent: int | None = None) -> list[int]:
    """Sequence hashes from local hashes, continuing after `parent`."""

def namespace_seed(namespace: str) -> int:
    """The hashing seed of a namespace (model, LoRA adapter, cache salt)."""

class Tier(enum.IntEnum):
    DEVICE = 0
    HOST = 1
    DISK = 2

TierLike = Tier | str

class Stored:
    """Blocks a worker cached: consecutive blocks of one sequence after `parent`."""

    def __init__(
        self,
        block_ids: Hashes,
        token_ids: Tokens | None = None,
        *,
        local_hashes: Hashes | None = None,
        parent: int | None = None,
        tier: TierLike | None = None,
        namespace: str = "",
    ) -> None: ...
    @property
    def block_ids(self) -> list[int]: ...
    @property
    def parent(self) -> int | None: ...

class Removed:
    """Blocks a worker evicted from one tier (default: device)."""

    def __init__(self, block_ids: Hashes, tier: TierLike | None = None) -> None: ...
    @property
    def block_ids(self) -> list[int]: ...

class Cleared:
    """The worker dropped its whole cache."""

    def __init__(self) -> None: ...

Event = Stored | Removed | Cleared

class ApplyOutcome:
    status: str
    """"applied", "duplicate", "gap" (resync the worker) or "rejected"."""
    expected_seq: int | None
    blocks_stored: int
    blocks_removed: int
    unknown_removals: int
    error: str | None

class OverlapScores:
    @property
    def scores(self) -> dict[int, int]:
        """{worker_id: matched blocks}"""
    @property
    def tiers(self) -> dict[int, tuple[int, int, int]]:
        """{worker_id: (device, host, disk) matched blocks}"""
    def depth(self, worker_id: int) -> int: ...
    def __len__(self) -> int: ...

class PrefixIndex:
    """Which workers hold which cached prefixes. Thread-safe; releases the GIL."""

    def __init__(
        self, block_size: int = 16, max_blocks: int | None = None, *, manual_clock: bool = False
    ) -> None:
        """With `manual_clock`, approximate entries expire by the time given to
        `set_time` (a simulator's virtual clock) instead of the wall clock."""
    @property
    def block_size(self) -> int: ...
    def set_time(self, now_s: float) -> None:
        """Moves a manual clock forward (never back); ValueError on a wall clock."""
    def apply(
        self, worker_id: int, seq: int, events: Iterable[Event], *, strict: bool = False
    ) -> ApplyOutcome:
        """Apply batch `seq`. Raises ValueError (malformed event), TypeError
        (not an event) or, with strict, KeyError (unknown block or parent);
        a raised batch changes nothing."""
    def apply_many(
        self, batches: Sequence[tuple[int, int, Iterable[Event]]], *, strict: bool = False
    ) -> list[ApplyOutcome]: ...
    def resync(self, worker_id: int, seq: int, events: Iterable[Event]) -> ApplyOutcome: ...
    def remove_worker(self, worker_id: int) -> int:
        """Drop a worker; returns its block count. KeyError if unknown."""
    def find_matches(self, seq_hashes: Hashes, *, early_exit: bool = False) -> OverlapScores: ...
    def find_matches_for_tokens(
        self, tokens: Tokens, *, namespace: str = "", early_exit: bool = False
    ) -> OverlapScores: ...
    def insert_approximate(self, worker_id: int, seq_hashes: Hashes, ttl_s: float) -> None: ...
    def stats(self) -> dict[str, int]:
        """{"blocks", "workers", "approximate", "pruned_total"}"""
    def workers(self) -> dict[int, tuple[int, int]]:
        """{worker_id: (confirmed blocks, next expected batch number)}"""
    def snapshot(self) -> bytes: ...
    @staticmethod
    def restore(data: bytes) -> PrefixIndex: ...

class NoWorkerAvailable(RuntimeError):
    """No healthy worker can take the request (none registered, all
    unhealthy, or none with room for the prompt)."""

# (worker, device, host, disk, (queue_ms, prefill_ms, reload_ms, decode_ms,
#  transfer_ms, overflow_ms, congestion_ms), active_requests, overloaded)
CostRow = tuple[float, float, float, float, float, float, float]
CandidateRow = tuple[int, int, int, int, CostRow, int, bool]

class RoutingCore:
    """The routing policy's scoring and load book (see kvrouter.policy.Router)."""

    def __init__(
        self,
        block_size: int,
        *,
        prefill_base_ms: float,
        prefill_ms_per_token: float,
        attention_ms_per_token2: float,
        decode_ms_per_block: float,
        host_reload_ms_per_block: float,
        disk_reload_ms_per_block: float,
        transfer_ms_per_block: float,
        max_batched_tokens: float,
        temperature: float,
        tie_tolerance: float,
        overload_factor: float,
        calibrate: bool,
        calibration_alpha: float,
        seed: int,
        local_prefill_max_tokens: int,
        prefill_saturation_ms: float,
        stale_after_s: float,
        congestion_weight: float,
    ) -> None: ...
    def upsert_worker(self, worker_id: int, role: str, capacity_blocks: int) -> None: ...
    def remove_worker(self, worker_id: int) -> list[str]:
        """Returns the ids of the requests that were booked on the worker."""
    def set_healthy(self, worker_id: int, healthy: bool) -> None: ...
    def report_load(
        self,
        worker_id: int,
        queued_prefill_tokens: int,
        active_decode_blocks: int,
        active_requests: int,
    ) -> None: ...
    def route(
        self,
        index: PrefixIndex,
        request_id: str,
        tokens: Tokens | None = None,
        *,
        hashes: Hashes | None = None,
        num_tokens: int | None = None,
        namespace: str = "",
        now_s: float,
        approximate_ttl_s: float = 0.0,
    ) -> tuple[int, int | None, float, int, int, str, list[CandidateRow], list[CandidateRow]]:
        """Looks the prompt (tokens, or block hashes) up in `index`, scores all
        candidates and books the winner(s), in one call with the GIL released:
        (decode_worker, prefill_worker, predicted_ttft_ms, prefill_tokens,
        num_blocks, reason, decode candidates, prefill candidates). With a
        positive approximate_ttl_s the chosen workers are recorded in the
        index as soon-to-hold the prompt. Raises NoWorkerAvailable, or
        ValueError for a request id already booked."""
    def prefill_done(self, request_id: str) -> bool: ...
    def release(self, request_id: str) -> bool: ...
    def observe_prefill(self, new_tokens: float, cached_tokens: float, ms: float) -> None: ...
    def observe_decode_step(self, active_blocks: float, ms: float) -> None: ...
    def observe_transfer(self, blocks: float, ms: float) -> None: ...
    def load(self, worker_id: int) -> tuple[int, int, int]: ...
    def coefficients(self) -> dict[str, float]: ...
    def __len__(self) -> int: ...

class RouteRefused(Exception):
    """A routing request the router turns down. args: (code, message,
    request_id), the code as grpc.StatusCode names it."""

def prompt_length(tokens: int, packed_bytes: int, max_tokens: int) -> int:
    """The prompt's token count from its `tokens` count and `tokens_u32le`
    byte length; ValueError unless exactly one is set, whole and within
    `max_tokens`."""

def check_namespace(namespace: str, max_chars: int) -> None:
    """Raises ValueError unless the namespace is printable and at most
    `max_chars` characters long."""

class WireRouter:
    """The Route RPC in the core: a serialized kvrouter.v1.RouteRequest in,
    a serialized RouteResponse out, with metrics and decision-log records
    kept until read."""

    def __init__(
        self,
        core: RoutingCore,
        index: PrefixIndex,
        *,
        id_prefix: str,
        max_prompt_tokens: int,
        max_namespace_chars: int,
        max_request_id_chars: int,
        approximate_ttl_s: float,
        latency_buckets: Sequence[float],
        overlap_buckets: Sequence[float],
        log_decisions: bool,
    ) -> None: ...
    def set_worker(self, worker_id: int, role: str, address: str) -> None:
        """Names a worker's role and address in responses."""
    def remove_worker(self, worker_id: int) -> None: ...
    def route(
        self, request: bytes, now_s: float
    ) -> tuple[bytes, str, int, int | None, int, int]:
        """Validates, decides and books, with the GIL released: (response,
        request_id, decode_worker, prefill_worker, prefill_tokens,
        num_blocks). `now_s` is the policy's clock. Raises RouteRefused."""
    def stats(
        self,
    ) -> tuple[
        list[tuple[int, str, int]],
        list[tuple[str, int]],
        tuple[list[int], float],
        tuple[list[int], float],
    ]:
        """(decisions as (worker, "decode" | "prefill", count), errors as
        (code, count), latency and overlap histograms as (bucket counts with
        +Inf last, sum))."""
    def take_decision_lines(self) -> str:
        """The decision-log lines (JSON, each ending in a newline) for the
        decisions made since the last call."""
