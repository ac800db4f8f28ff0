"""Type stubs for kvrouter._core, the Rust core: block hashing, KV events,
the prefix index, and the router: the routing decision (lookup, policy,
load book, predictions, stats, decision records) for prompts and for
serialized RouteRequests."""

import array
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, Literal, Protocol, Self, TypeAlias, final

from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

__all__ = [
    "hash_tokens",
    "hash_tokens_array",
    "local_block_hashes",
    "chain_hashes",
    "namespace_seed",
    "model_namespace",
    "Tier",
    "Stored",
    "Removed",
    "EndsReusable",
    "Cleared",
    "PublishHello",
    "DecodedBatch",
    "decode_publish_request",
    "ApplyOutcome",
    "OverlapScores",
    "PrefixIndex",
    "PolicyConfig",
    "Candidate",
    "Explanation",
    "Decision",
    "Booking",
    "Histogram",
    "RouteStats",
    "Router",
    "check_namespace",
    "check_model",
    "prompt_length",
    "CompletionStream",
    "prompt_body_json",
    "token_ids_from_json",
    "RouteRefused",
    "NoWorkerAvailable",
    "UnknownModel",
    "DEFAULT_BLOCK_SIZE",
    "ADAPTER_SEPARATOR",
    "MAX_SESSION_CHARS",
]

DEFAULT_BLOCK_SIZE: int
# Between a model and an adapter in a requested model name: "model:adapter".
ADAPTER_SEPARATOR: str
# The longest session id a route request may name.
MAX_SESSION_CHARS: int

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

def model_namespace(model: str, namespace: str) -> str:
    """The namespace a model's blocks hash in, salted by `namespace`: what a
    worker serving `model` publishes its blocks under, and what the router
    looks a request for `model` up in. With no model, `namespace` alone."""

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
class EndsReusable:
    """Blocks a worker holds, marked as ends a reused prefix may stop at
    (`reusable`) or not."""

    def __new__(cls, block_ids: Hashes, reusable: bool) -> Self: ...
    @property
    def block_ids(self) -> list[int]: ...

@final
class Cleared:
    """The worker dropped its whole cache."""

    def __new__(cls) -> Self: ...

Event: TypeAlias = Stored | Removed | EndsReusable | Cleared

@final
class PublishHello:
    @property
    def worker_id(self) -> int: ...
    @property
    def next_seq(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def registration_token(self) -> int:
        """0: not given."""

@final
class DecodedBatch:
    """An event batch decoded and checked by the core; its events stay there."""
    @property
    def seq(self) -> int: ...
    @property
    def resync(self) -> bool: ...
    @property
    def emitted_at(self) -> float: ...
    @property
    def blocks(self) -> int:
        """Blocks stored by the batch's events."""
    def __len__(self) -> int: ...

def decode_publish_request(
    data: bytes, block_size: int, max_events: int
) -> PublishHello | DecodedBatch:
    """A serialized PublishRequest; ValueError naming the batch and event."""

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
    def apply_decoded(self, worker_id: int, batch: DecodedBatch) -> ApplyOutcome:
        """Applies (or, for a resync dump, replaces with) a decoded batch, a
        slice of the index at a time. Apply one worker's batches one at a
        time: if the worker is removed or resynced meanwhile, the rest of the
        batch is dropped and the outcome counts the part applied."""
    def remove_worker(self, worker_id: int) -> int:
        """Drop a worker; returns its block count. KeyError if unknown."""
    def find_matches(self, seq_hashes: Hashes, *, early_exit: bool = False) -> OverlapScores: ...
    def find_matches_for_tokens(
        self, tokens: Tokens, *, namespace: str = "", early_exit: bool = False
    ) -> OverlapScores: ...
    def insert_approximate(self, worker_id: int, seq_hashes: Hashes, ttl_s: float) -> None: ...
    def reserve(self, capacity_blocks: int) -> None:
        """Sizes the tables for workers that can hold `capacity_blocks` blocks together
        (at most `max_blocks` and 2**24): one home per block, kept until the next call
        (fewer shrinks them), so that applying their events does not double a table, one
        stalling step, until more than 7/8 of those blocks are distinct. The tables are
        made before the index is locked and swapped in under the lock, so lookups go on
        meanwhile. A router sizes its index for its registered workers, in the background."""
    def wait_sized(self) -> None:
        """Waits until the index is sized as last asked in the background (a router asks
        at every registration and removal), and an engine's name table, made for the
        batch of its first ids, has its reserved size."""
    def stats(self) -> dict[str, int]:
        """{"blocks", "workers", "approximate", "pruned_total", "table_bytes"}"""
    def workers(self) -> dict[int, tuple[int, int]]:
        """{worker_id: (confirmed blocks, next expected batch number)}"""
    def snapshot(self, *, stream_position: int = 0, next_worker_id: int = 0) -> bytes:
        """The confirmed index, sealed with its length and an xxh3 checksum,
        with two counters its owner keeps with it."""
    @staticmethod
    def restore(data: bytes) -> PrefixIndex:
        """ValueError, naming what is wrong, for truncated or corrupt bytes."""
    @staticmethod
    def restore_marked(data: bytes) -> tuple[PrefixIndex, dict[str, int]]:
        """`restore`, and {"stream_position", "next_worker_id"} as stored."""

class NoWorkerAvailable(RuntimeError):
    """No healthy worker can take the request (none registered, all
    unhealthy, or none with room for the prompt)."""

class UnknownModel(LookupError):
    """The request names a model that no registered worker serves."""

PolicyName: TypeAlias = Literal[
    "kvrouter", "round_robin", "random", "least_loaded", "overlap_only", "dynamo"
]

@final
class PolicyConfig:
    """The routing policy's settings; defaults are the core's. What each
    means: docs/routing.md. Raises ValueError for a setting out of range,
    TypeError for an unknown one."""

    policy: str
    prefill_base_ms: float
    prefill_ms_per_token: float
    attention_ms_per_token2: float
    decode_ms_per_block: float
    host_reload_ms_per_block: float
    disk_reload_ms_per_block: float
    transfer_ms_per_block: float
    max_batched_tokens: int
    calibrate: bool
    calibration_alpha: float
    temperature: float
    tie_tolerance: float
    overload_factor: float
    congestion_weight: float
    pollution_weight: float
    tail_weight: float
    seed: int
    local_prefill_max_tokens: int
    prefill_saturation_ms: float
    stale_after_s: float
    unreported_grace_s: float
    approximate_ttl_s: float
    def __new__(cls, **settings: Any) -> Self: ...
    def replace(self, **settings: Any) -> PolicyConfig:
        """A copy with some settings changed."""
    def validate(self) -> None: ...
    @staticmethod
    def fields() -> list[tuple[str, Literal["str", "float", "int", "bool"]]]:
        """Every setting's name and Python type name."""
    @staticmethod
    def policies() -> list[PolicyName]: ...
    def to_dict(self) -> dict[str, Any]: ...
    def __copy__(self) -> PolicyConfig: ...
    def __deepcopy__(self, memo: Any) -> PolicyConfig: ...
    def __reduce__(self) -> tuple[Any, tuple[()]]: ...
    def __eq__(self, value: object, /) -> bool: ...

@final
class Candidate:
    """One worker as the policy scored it for one request."""

    @property
    def worker_id(self) -> int: ...
    @property
    def overlap_device(self) -> int: ...
    @property
    def overlap_host(self) -> int: ...
    @property
    def overlap_disk(self) -> int: ...
    @property
    def overlap(self) -> int: ...
    @property
    def cost_ms(self) -> float:
        """What choosing it costs (ms): its TTFT plus the latency it adds to the
        requests queued behind it and decoding beside it."""
    @property
    def queue_ms(self) -> float: ...
    @property
    def prefill_ms(self) -> float: ...
    @property
    def reload_ms(self) -> float: ...
    @property
    def decode_ms(self) -> float: ...
    @property
    def transfer_ms(self) -> float: ...
    @property
    def overflow_ms(self) -> float: ...
    @property
    def congestion_ms(self) -> float: ...
    @property
    def stall_ms(self) -> float: ...
    @property
    def slowdown_ms(self) -> float: ...
    @property
    def pollution_ms(self) -> float: ...
    @property
    def tail_ms(self) -> float: ...
    @property
    def ttft_ms(self) -> float: ...
    @property
    def active_requests(self) -> int: ...
    @property
    def overloaded(self) -> bool: ...
    def to_dict(self) -> dict[str, Any]: ...
    def __eq__(self, value: object, /) -> bool: ...

@final
class Explanation:
    """The candidates with their overlaps and predicted costs, and why the
    winner won. In a split, decode candidates' costs include the prefill."""

    @property
    def reason(self) -> str: ...
    @property
    def decode_candidates(self) -> list[Candidate]: ...
    @property
    def prefill_candidates(self) -> list[Candidate]: ...
    def decode_candidate(self, worker_id: int | None) -> Candidate | None: ...
    def prefill_candidate(self, worker_id: int | None) -> Candidate | None: ...
    def to_dict(self) -> dict[str, Any]: ...

@final
class Decision:
    """Where a request goes; `prefill_worker` is None when the decode worker
    prefills the prompt itself."""

    @property
    def request_id(self) -> str: ...
    @property
    def decode_worker(self) -> int: ...
    @property
    def prefill_worker(self) -> int | None: ...
    @property
    def disaggregated(self) -> bool: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def prefill_tokens(self) -> int: ...
    @property
    def predicted_ttft_ms(self) -> float: ...
    @property
    def explanation(self) -> Explanation: ...
    def to_dict(self) -> dict[str, Any]: ...

@final
class Booking:
    """One request's load as a router booked it, shared with peer replicas."""

    @property
    def prefill_worker(self) -> int: ...
    @property
    def decode_worker(self) -> int: ...
    @property
    def prefill_tokens(self) -> int: ...
    @property
    def decode_blocks(self) -> int: ...
    @property
    def prefill_open(self) -> bool: ...
    def __new__(
        cls,
        prefill_worker: int,
        decode_worker: int,
        prefill_tokens: int,
        decode_blocks: int,
        prefill_open: bool = True,
    ) -> Self: ...
    def __eq__(self, value: object, /) -> bool: ...

@final
class Histogram:
    """Bucket counts as Prometheus reads them; `counts` has one more entry
    than `bounds`, for +Inf."""

    @property
    def bounds(self) -> list[float]: ...
    @property
    def counts(self) -> list[int]: ...
    @property
    def sum(self) -> float: ...

RefusalCode: TypeAlias = Literal["INVALID_ARGUMENT", "INTERNAL", "UNAVAILABLE"]

@final
class RouteStats:
    """A router's figures so far."""

    @property
    def decisions(self) -> list[tuple[int, Literal["decode", "prefill"], int]]: ...
    @property
    def errors(self) -> list[tuple[RefusalCode, int]]: ...
    @property
    def latency(self) -> Histogram: ...
    @property
    def overlap(self) -> Histogram: ...
    @property
    def retired_unreported(self) -> int:
        """Bookings retired because their worker's report no longer counted them."""
    @property
    def by_affinity(self) -> int:
        """Decisions a session's last worker won among tied candidates."""

BookingChange: TypeAlias = tuple[Literal["routed", "prefill_done", "released"], str, Booking | None]

@final
class Router:
    """The routing decision over an index: `route` (a prompt in, a Decision
    out) and `route_wire` (RouteRequest bytes in, RouteResponse bytes out)
    decide through the same core call with the GIL released, and both are
    counted in `stats` and the decision log. Thread-safe. With `size_index` it
    sizes the index's tables for its registered workers' capacity
    (PrefixIndex.reserve) as they come and go."""

    def __new__(
        cls,
        index: PrefixIndex,
        config: PolicyConfig | None = None,
        *,
        clock: Callable[[], float] | None = None,
        id_prefix: str = "r",
        log_decisions: bool = False,
        share_bookings: bool = False,
        size_index: bool = True,
        max_prompt_tokens: int | None = None,
        max_namespace_chars: int | None = None,
        max_model_chars: int | None = None,
        max_request_id_chars: int | None = None,
    ) -> Self: ...
    @property
    def index(self) -> PrefixIndex: ...
    @property
    def config(self) -> PolicyConfig:
        """A copy of the settings in force."""
    @property
    def block_size(self) -> int: ...
    @property
    def uses_index(self) -> bool: ...
    def upsert_worker(
        self,
        worker_id: int,
        role: str,
        capacity_blocks: int,
        address: str = ...,
        *,
        model: str = ...,
        adapters: list[str] = ...,
    ) -> None:
        """Routed requests for `model` ("" : requests that name none) and for
        `model:adapter` for each of `adapters`. The index is sized for all
        registered workers' `capacity_blocks` (PrefixIndex.reserve), in the background:
        PrefixIndex.wait_sized waits for it."""
    def remove_worker(self, worker_id: int) -> list[str]:
        """Forgets the worker; returns the ids of requests booked on it."""
    def set_healthy(self, worker_id: int, healthy: bool) -> None: ...
    def report_load(
        self,
        worker_id: int,
        queued_prefill_tokens: int,
        active_decode_blocks: int,
        active_requests: int,
    ) -> int:
        """Returns how many bookings the report retired: ones the worker no
        longer counts, past `unreported_grace_s`, whose finish never came."""
    def report_prefill_timing(
        self, new_tokens: float, cached_tokens: float, duration_ms: float
    ) -> None: ...
    def report_decode_step(self, active_blocks: float, duration_ms: float) -> None: ...
    def report_transfer(self, blocks: float, duration_ms: float) -> None: ...
    def coefficients(self) -> dict[str, float]: ...
    def load(self, worker_id: int) -> tuple[int, int, int]:
        """(queued prefill tokens, active decode blocks, active requests) as scored."""
    def backlog_ms(self, model: str = "") -> float | None:
        """Predicted ms of prefill queued on the least loaded healthy worker of
        `model`; None when none is healthy. Raises UnknownModel."""
    def route(
        self,
        request_id: str,
        tokens: Tokens | None = None,
        namespace: str = "",
        *,
        model: str = "",
        hashes: Hashes | None = None,
        num_tokens: int | None = None,
        session: str = "",
    ) -> Decision:
        """Picks among the workers of `model` and books the load; tokens
        hash in the model's namespace salted by `namespace`. A `session` id
        sends it, among equally good workers, where the session's last
        request went. Raises UnknownModel, NoWorkerAvailable, or ValueError
        for a request id in flight or a session id that is too long or not
        printable."""
    def route_wire(self, request: bytes) -> tuple[bytes, str]:
        """(serialized RouteResponse, request id); raises RouteRefused."""
    def prefill_done(self, request_id: str) -> bool: ...
    def finished(self, request_id: str) -> bool: ...
    def cancelled(self, request_id: str) -> bool: ...
    def canonical_model(self, model: str) -> str:
        """The name a request for `model` routes and hashes under:
        "model:adapter" when it names an adapter by itself and exactly one
        model has that adapter, else `model` as it is. Raises UnknownModel,
        naming them, when several models have that adapter."""
    def models(self) -> list[tuple[str, int]]:
        """Every model name workers serve ("model", "model:adapter"; "" for
        workers that name none, and an adapter's own name where exactly one
        model has it), with how many of its workers are routable now
        (healthy and decode-capable: a prefill worker alone answers no
        request), sorted by name."""
    def __len__(self) -> int: ...
    def stats(self) -> RouteStats: ...
    def take_decision_lines(self) -> str:
        """JSON lines of the decisions made since the last call."""
    def take_booking_changes(self) -> list[BookingChange]: ...
    def own_bookings(self) -> list[tuple[str, Booking]]: ...
    def book_remote(self, replica: str, request_id: str, booking: Booking) -> None: ...
    def remote_prefill_done(self, replica: str, request_id: str) -> bool: ...
    def release_remote(self, replica: str, request_id: str) -> bool: ...
    def replace_remote(self, replica: str, bookings: list[tuple[str, Booking]]) -> None: ...
    def drop_replica(self, replica: str) -> int: ...
    def remote_bookings(self, replica: str) -> int: ...
    def knows_remote(self, replica: str, request_id: str) -> bool: ...

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

def check_model(model: str, max_chars: int) -> None:
    """Raises ValueError unless the model name is printable and at most
    `max_chars` characters long."""

@final
class CompletionStream:
    """One engine's streamed `/v1/completions` answer (vLLM, SGLang, asked
    with `return_token_ids`), fed its body's bytes as they arrive."""

    def __new__(cls, limit: int, logprobs: int | None = None) -> Self:
        """`limit`: the most bytes one event's data may hold. `logprobs`:
        read each token's log probability with this many most likely
        tokens' (vLLM's shape with `return_tokens_as_token_ids`); None:
        none."""

    def feed(
        self, data: bytes
    ) -> tuple[list[int], str | None, bool, list[tuple[float, list[tuple[int, float]]]]]:
        """(token ids, finish reason, ended, log probabilities) of what
        `data` added: the reason is "stop", "length" or None; `ended` once
        a finish or `[DONE]` has come; when asked for, one (log
        probability, [(token id, log probability)] most likely first) per
        token, else empty. ValueError, with the reason, when the stream
        cannot be read on (an error event, a bad event, an event past the
        limit); NotImplementedError when its tokens come without the log
        probabilities asked for, or without naming their ids."""

    @property
    def ended(self) -> bool: ...

def prompt_body_json(tokens: Tokens, fields: bytes) -> bytes:
    """An engine's request body: a JSON object whose first field, `prompt`,
    is `tokens` as an array of ints, followed by the fields of `fields`, a
    JSON object's bytes (as msgspec writes it). ValueError when `fields`
    is not an object's."""

def token_ids_from_json(json: Buffer) -> bytes | None:
    """The ids a JSON array of integers in 0..2**32 holds, as little-endian u32
    bytes (for `array('I').frombytes`); None for any other JSON. `json` is any
    contiguous byte buffer (bytes, `msgspec.Raw`)."""
