"""Protobuf messages to and from the core's types, with input validation."""

from __future__ import annotations

from kvrouter._core import Cleared, Removed, Stored, Tier
from kvrouter.policy import CandidateCost, Decision
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.service.errors import invalid

TIERS = (Tier.DEVICE, Tier.HOST, Tier.DISK)
ROLE_NAMES = {pb.ROLE_PREFILL: "prefill", pb.ROLE_DECODE: "decode", pb.ROLE_BOTH: "both"}
ROLE_VALUES = {name: value for value, name in ROLE_NAMES.items()}


def prompt_tokens(request, max_tokens: int) -> bytes | list[int]:
    """The prompt of a RouteRequest/GenerateRequest: the packed little-endian
    bytes as they arrived (the core reads them in place), or a list."""
    packed = request.tokens_u32le
    if packed:
        if len(request.tokens):
            raise invalid("set only one of tokens and tokens_u32le")
        if len(packed) % 4:
            raise invalid(f"tokens_u32le has {len(packed)} bytes, not a multiple of 4")
        count = len(packed) // 4
    else:
        count = len(request.tokens)
    if count == 0:
        raise invalid("the prompt is empty")
    if count > max_tokens:
        raise invalid(f"the prompt has {count} tokens; this router accepts at most {max_tokens}")
    return packed if packed else list(request.tokens)


def check_namespace(namespace: str, max_chars: int) -> None:
    if len(namespace) > max_chars:
        raise invalid(f"namespace is {len(namespace)} characters; the limit is {max_chars}")
    if not namespace.isprintable():
        raise invalid("namespace must not contain control characters")


def core_events(events) -> list:
    """KvEvent messages as the index's Stored/Removed/Cleared."""
    out = []
    for i, event in enumerate(events):
        kind = event.WhichOneof("kind")
        if kind == "stored":
            s = event.stored
            parent = s.parent_block_id if s.HasField("parent_block_id") else None
            tier = _tier(s.tier, i)
            if len(s.local_hashes):
                if len(s.token_ids):
                    raise invalid(f"event {i}: set only one of token_ids and local_hashes")
                out.append(
                    Stored(
                        list(s.block_ids),
                        local_hashes=list(s.local_hashes),
                        parent=parent,
                        tier=tier,
                        namespace=s.namespace,
                    )
                )
            else:
                out.append(
                    Stored(
                        list(s.block_ids),
                        list(s.token_ids),
                        parent=parent,
                        tier=tier,
                        namespace=s.namespace,
                    )
                )
        elif kind == "removed":
            out.append(Removed(list(event.removed.block_ids), _tier(event.removed.tier, i)))
        elif kind == "cleared":
            out.append(Cleared())
        else:
            raise invalid(f"event {i} is empty (no stored, removed or cleared)")
    return out


def _tier(value: int, i: int) -> Tier:
    if not 0 <= value < len(TIERS):
        raise invalid(f"event {i}: unknown tier {value}")
    return TIERS[value]


def _candidate(c: CandidateCost, roles) -> pb.Candidate:
    return pb.Candidate(
        worker_id=c.worker_id,
        role=roles(c.worker_id),
        overlap_device=c.overlap_device,
        overlap_host=c.overlap_host,
        overlap_disk=c.overlap_disk,
        cost_ms=c.cost_ms,
        queue_ms=c.queue_ms,
        prefill_ms=c.prefill_ms,
        reload_ms=c.reload_ms,
        decode_ms=c.decode_ms,
        transfer_ms=c.transfer_ms,
        overflow_ms=c.overflow_ms,
        active_requests=c.active_requests,
        overloaded=c.overloaded,
    )


def route_response(decision: Decision, workers, explain: bool) -> pb.RouteResponse:
    """A RouteResponse; without `explain`, only the chosen candidates.
    `workers` is the WorkerTable, for roles and addresses."""
    ex = decision.explanation
    if explain:
        decode, prefill = ex.decode_candidates, ex.prefill_candidates
    else:
        decode = [c for c in (ex.decode_candidate(decision.decode_worker),) if c]
        prefill = [c for c in (ex.prefill_candidate(decision.prefill_worker),) if c]
    response = pb.RouteResponse(
        request_id=decision.request_id,
        decode_worker=decision.decode_worker,
        disaggregated=decision.disaggregated,
        decode_address=workers.address(decision.decode_worker),
        num_blocks=decision.num_blocks,
        predicted_ttft_ms=decision.predicted_ttft_ms,
        explanation=pb.Explanation(
            reason=ex.reason,
            decode_candidates=[_candidate(c, workers.role) for c in decode],
            prefill_candidates=[_candidate(c, workers.role) for c in prefill],
        ),
    )
    if decision.prefill_worker is not None:
        response.prefill_worker = decision.prefill_worker
        response.prefill_address = workers.address(decision.prefill_worker)
    return response
