"""What the client returns: plain dataclasses and exceptions, not protobufs."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from kvrouter.net.worker_protocol import KV_TRANSFER_NONE, KVROUTER


@dataclass(frozen=True)
class Candidate:
    """One worker as the router scored it for one request (costs in ms)."""

    worker_id: int
    role: str
    overlap_device: int
    overlap_host: int
    overlap_disk: int
    cost_ms: float
    queue_ms: float
    prefill_ms: float
    reload_ms: float
    decode_ms: float
    transfer_ms: float
    overflow_ms: float
    congestion_ms: float
    stall_ms: float
    slowdown_ms: float
    pollution_ms: float
    tail_ms: float
    active_requests: int
    overloaded: bool

    @property
    def overlap(self) -> int:
        """Blocks of the prompt the worker holds, all tiers together."""
        return self.overlap_device + self.overlap_host + self.overlap_disk


@dataclass(frozen=True)
class Explanation:
    reason: str
    decode_candidates: tuple[Candidate, ...] = ()
    prefill_candidates: tuple[Candidate, ...] = ()


@dataclass(frozen=True)
class RouteResult:
    """Where a request goes. `prefill_worker` is None when the decode worker
    prefills the prompt itself."""

    request_id: str
    decode_worker: int
    prefill_worker: int | None
    disaggregated: bool
    decode_address: str
    prefill_address: str
    num_blocks: int
    predicted_ttft_ms: float
    explanation: Explanation


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: int
    role: str
    address: str
    block_size: int
    capacity_blocks: int
    metadata: dict[str, str]
    # The model it serves ("" : none named) and its adapters, as registered.
    model: str
    adapters: tuple[str, ...]
    routable: bool
    seconds_since_heartbeat: float
    index_blocks: int
    next_event_seq: int
    queued_prefill_tokens: int
    active_decode_blocks: int
    active_requests: int
    # What `address` speaks: "kvrouter" or "openai" (kvrouter.net.worker_protocol).
    protocol: str = KVROUTER
    # How an OpenAI engine takes part in a split request: "none", "vllm"
    # or "sglang"; and SGLang's bootstrap port.
    kv_transfer: str = KV_TRANSFER_NONE
    bootstrap_port: int = 0
    # The engine's DP rank it stands for behind a shared address, if any.
    data_parallel_rank: int | None = None


@dataclass(frozen=True)
class WorkerLoad:
    """Load figures a worker reports with each heartbeat."""

    queued_prefill_tokens: int = 0
    active_decode_blocks: int = 0
    active_requests: int = 0


@dataclass(frozen=True)
class Registration:
    worker_id: int
    heartbeat_interval_s: float
    heartbeat_ttl_s: float
    metadata: dict[str, str] = field(default_factory=dict)


class RouterError(Exception):
    """The router refused a call; `code` is the gRPC status code."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class InvalidArgument(RouterError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(RouterError):
    code = grpc.StatusCode.NOT_FOUND


class Unavailable(RouterError):
    """No healthy worker can take the request, or the router is unreachable."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(RouterError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


_BY_CODE = {cls.code: cls for cls in (InvalidArgument, NotFound, Unavailable, DeadlineExceeded)}


def error_for(code: grpc.StatusCode, message: str) -> RouterError:
    """The most specific RouterError for a status code."""
    cls = _BY_CODE.get(code)
    return cls(message) if cls is not None else RouterError(message, code)
