"""Protobuf messages to and from the core's types, with input validation."""

from __future__ import annotations

from kvrouter._core import Cleared, Removed, Stored, Tier, prompt_length
from kvrouter._core import check_namespace as core_check_namespace
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.service.errors import invalid

TIERS = (Tier.DEVICE, Tier.HOST, Tier.DISK)
ROLE_NAMES = {pb.ROLE_PREFILL: "prefill", pb.ROLE_DECODE: "decode", pb.ROLE_BOTH: "both"}
ROLE_VALUES = {name: value for value, name in ROLE_NAMES.items()}


def prompt_tokens(request, max_tokens: int) -> bytes | list[int]:
    """The prompt of a GenerateRequest: the packed little-endian bytes as
    they arrived (the core reads them in place), or a list. Checked by the
    rule the routing path applies in the core."""
    packed = request.tokens_u32le
    try:
        prompt_length(len(request.tokens), len(packed), max_tokens)
    except ValueError as e:
        raise invalid(str(e)) from None
    return packed if packed else list(request.tokens)


def check_namespace(namespace: str, max_chars: int) -> None:
    """The rule the routing path applies in the core."""
    try:
        core_check_namespace(namespace, max_chars)
    except ValueError as e:
        raise invalid(str(e)) from None


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
