"""Client-side conversions: token encoding and protobuf to dataclasses."""

from __future__ import annotations

import sys
from array import array

import grpc

from kvrouter.client.types import (
    Candidate,
    Explanation,
    RouterError,
    RouteResult,
    WorkerInfo,
    error_for,
)
from kvrouter.net.worker_protocol import KV_TRANSFER_NAMES, PROTOCOL_NAMES
from kvrouter.proto_gen import router_pb2 as pb

ROLE_VALUES = {"prefill": pb.ROLE_PREFILL, "decode": pb.ROLE_DECODE, "both": pb.ROLE_BOTH}
ROLE_NAMES = {v: k for k, v in ROLE_VALUES.items()}
_BIG_ENDIAN = sys.byteorder == "big"


def encode_tokens(tokens) -> bytes:
    """Token ids (list, array('I'), numpy array or u32le bytes) as u32le bytes."""
    if isinstance(tokens, bytes | bytearray | memoryview):
        return bytes(tokens)
    if isinstance(tokens, array) and tokens.typecode == "I" and not _BIG_ENDIAN:
        return tokens.tobytes()
    if hasattr(tokens, "astype"):
        return tokens.astype("<u4", copy=False).tobytes()
    try:
        packed = array("I", tokens)
    except (OverflowError, TypeError) as e:
        raise ValueError(f"token ids must be integers in [0, 2**32): {e}") from None
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def route_request(
    tokens, model: str, namespace: str, request_id: str, explain: bool
) -> pb.RouteRequest:
    return pb.RouteRequest(
        tokens_u32le=encode_tokens(tokens),
        model=model,
        namespace=namespace,
        request_id=request_id,
        explain=explain,
    )


def _candidate(c: pb.Candidate) -> Candidate:
    return Candidate(
        c.worker_id,
        c.role,
        c.overlap_device,
        c.overlap_host,
        c.overlap_disk,
        c.cost_ms,
        c.queue_ms,
        c.prefill_ms,
        c.reload_ms,
        c.decode_ms,
        c.transfer_ms,
        c.overflow_ms,
        c.congestion_ms,
        c.stall_ms,
        c.slowdown_ms,
        c.pollution_ms,
        c.tail_ms,
        c.active_requests,
        c.overloaded,
    )


def route_result(r: pb.RouteResponse) -> RouteResult:
    """A RouteResponse as a RouteResult; raises the RouterError it carries."""
    if r.HasField("error"):
        raise error_for(_STATUS.get(r.error.code, grpc.StatusCode.UNKNOWN), r.error.message)
    ex = r.explanation
    return RouteResult(
        request_id=r.request_id,
        decode_worker=r.decode_worker,
        prefill_worker=r.prefill_worker if r.HasField("prefill_worker") else None,
        disaggregated=r.disaggregated,
        decode_address=r.decode_address,
        prefill_address=r.prefill_address,
        num_blocks=r.num_blocks,
        predicted_ttft_ms=r.predicted_ttft_ms,
        explanation=Explanation(
            ex.reason,
            tuple(_candidate(c) for c in ex.decode_candidates),
            tuple(_candidate(c) for c in ex.prefill_candidates),
        ),
    )


_STATUS = {code.value[0]: code for code in grpc.StatusCode}


def worker_info(w: pb.WorkerInfo) -> WorkerInfo:
    return WorkerInfo(
        worker_id=w.worker_id,
        role=ROLE_NAMES.get(w.role, "unspecified"),
        address=w.address,
        block_size=w.block_size,
        capacity_blocks=w.capacity_blocks,
        metadata=dict(w.metadata),
        model=w.model,
        adapters=tuple(w.adapters),
        routable=w.routable,
        seconds_since_heartbeat=w.seconds_since_heartbeat,
        index_blocks=w.index_blocks,
        next_event_seq=w.next_event_seq,
        queued_prefill_tokens=w.queued_prefill_tokens,
        active_decode_blocks=w.active_decode_blocks,
        active_requests=w.active_requests,
        protocol=PROTOCOL_NAMES.get(w.protocol, "unspecified"),
        kv_transfer=KV_TRANSFER_NAMES.get(w.kv_transfer, "unspecified"),
        bootstrap_port=w.bootstrap_port,
        data_parallel_rank=w.data_parallel_rank if w.HasField("data_parallel_rank") else None,
    )


def rpc_error(e: grpc.RpcError) -> RouterError:
    return error_for(e.code(), e.details() or "")
