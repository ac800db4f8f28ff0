"""Type stubs for kvrouter._core, the Rust core: block hashing, KV events,
the prefix index, and the routing policy's scoring core and Route RPC."""

import array
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Literal, Protocol, Self, TypeAlias, final

from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

__all__ = [
    "hash_tokens",
    "hash_tokens_array",
    "local_block_hashes",
    "chain_hashes",
    "namespace_seed",
    "Tier",
    "Stored",
    "Removed",
    "Cleared",
    "ApplyOutcome",
    "OverlapScores",
    "PrefixIndex",
    "RoutingCore",
    "WireRouter",
    "check_namespace",
    "prompt_length",
    "RouteRefused",
    "NoWorkerAvailable",
    "DEFAULT_BLOCK_SIZE",
]

DEFAULT_BLOCK_SIZE: int

class _NumpyArray(Protocol):
    """A numpy array: its stubs declare the buffer protocol only on Python 3.12+."""

    @property
    def __array_interface__(self) -> dict[str, Any]: ...

# Token ids (u32): a list or tuple of ints, or a buffer: array('I'), a 1-D
# numpy uint32/int32/int64 array, or little-endian uint32 bytes. C-contiguous
# uint32, int32 and 4-aligned byte buffers are read in place; other buffers
# (int64, strided) are copied once.
Tokens: TypeAlias = list[int] | tuple[int, ...] | Buffer | _NumpyArray
# Block hashes (u64): a sequence of ints in [0, 2**64), or a uint64/int64
# buffer (array('Q'), numpy), copied once into native integers.
Hashes: TypeAlias = Sequence[int] | Buffer | _NumpyArray

# `block_size` defaults to DEFAULT_BLOCK_SIZE (16).
def hash_tokens(tokens: Tokens, block_size: int = ..., namespace: str = "") -> list[int]:
    """Chained sequence hashes of the full blocks; a partial tail is not hashed."""

def hash_tokens_array(
    tokens: Tokens, block_size: int = ..., namespace: str = ""
) -> array.array[int]:
    """`hash_tokens` as array('Q'): no Python int per hash."""

def local_block_hashes(tokens: Tokens, block_size: int = ..., namespace: str = "") -> list[int]:
    """xxh3-64 of each full block's little-endian bytes, seeded by the namespace."""

def chain_hashes(local_hashes: Sequence[int], parent: int | None = None) -> list[int]:
    """Sequence hashes from local hashes, continuing after `parent`."""

def namespace_seed(namespace: str) -> int:
    """The hashing seed of a namespace (model, LoRA adapter, cache salt)."""

@final
class Tier:
    """Where a worker keeps a block. A PyO3 enum: its members compare equal
    to their ints (DEVICE == 0) and convert with int()."""

    DEVICE: ClassVar[Tier]
    HOST: ClassVar[Tier]
    DISK: ClassVar[Tier]
    def __int__(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

# A Tier or its name ("device", "host", "disk", in any case).
TierLike: TypeAlias = Tier | str

@final
class Stored:
    """Blocks a worker cached: consecutive blocks of one sequence after `parent`."""

    def __new__(
        cls,
        block_ids: Hashes,
        token_ids: Tokens | None = None,
        *,
        local_hashes: Hashes | None = None,
        parent: int | None = None,
        tier: TierLike | None = None,
        namespace: str = "",
    ) -> Self: ...
    @property
    def block_ids(self) -> list[int]: ...
    @property
    def parent(self) -> int | None: ...

@final
class Removed:
    """Blocks a worker evicted from one tier (default: device)."""

    def __new__(cls, block_ids: Hashes, tier: TierLike | None = None) -> Self: ...
    @property
    def block_ids(self) -> list[int]: ...

@final
class Cleared:
    """The worker dropped its whole cache."""

    def __new__(cls) -> Self: ...

Event: TypeAlias = Stored | Removed | Cleared

@final
class ApplyOutcome:
    @property
    def status(self) -> Literal["applied", "duplicate", "gap", "rejected"]:
        """On a "gap" the batch skips ahead and nothing is applied: resync the worker."""
    @property
    def expected_seq(self) -> int | None:
        """For "gap": the batch number the worker should have sent."""
    @property
    def blocks_stored(self) -> int: ...
    @property
    def blocks_removed(self) -> int: ...
    @property
    def unknown_removals(self) -> int: ...
    @property
    def error(self) -> str | None:
        """For "rejected": why."""

@final
class OverlapScores:
    @property
    def scores(self) -> dict[int, int]:
        """{worker_id: matched blocks}"""
    @property
    def tiers(self) -> dict[int, tuple[int, int, int]]:
        """{worker_id: (device, host, disk) matched blocks}"""
    def depth(self, worker_id: int) -> int: ...
    def __len__(self) -> int: ...

@final
class PrefixIndex:
    """Which workers hold which cached prefixes. Thread-safe; releases the GIL."""

    def __new__(
        cls, block_size: int = ..., max_blocks: int | None = None, *, manual_clock: bool = False
    ) -> Self:
        """`block_size` defaults to DEFAULT_BLOCK_SIZE (16). With
        `manual_clock`, approximate entries expire by the time given to
        `set_time` (a simulator's virtual clock, from 0) instead of the wall
        clock."""
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
