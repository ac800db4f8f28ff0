"""vLLM events → the router's engine-neutral events.

- Engine block hashes become opaque u64 engine ids; the index maps them to
  the router's own hashes, which it computes from `token_ids`, so the
  engine's hash seed and scheme never matter.
- `medium` becomes the tier. An unknown medium is skipped: claiming a tier
  the router cannot price would be worse than not knowing the block.
- Blocks hash in the engine's model's namespace (`_core.model_namespace`,
  salted by its `namespace`), LoRA blocks in the adapter's (`model:lora`,
  with `lora_name`, or `lora-<id>` from engines that only send the id): what
  the router looks requests for `model` and `model:adapter` up in. An engine
  that names no model keeps the namespaces it had before models: its own,
  and the adapter's name alone.
- A block whose `extra_keys` carry more than its LoRA name (multimodal
  hashes, a cache salt) is not determined by its tokens alone. It hashes in a
  namespace derived from those keys, so it (and, through the chain, every
  block after it) never matches a query made of the same tokens.
- Hybrid models report one stream per KV cache group; only `kv_group` is
  indexed (its blocks determine prefix reuse for the whole model).
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from typing import Any

import msgspec

from kvrouter._core import ADAPTER_SEPARATOR, model_namespace
from kvrouter.adapters.vllm.wire import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    WireEvent,
)
from kvrouter.events import Cleared, Event, Removed, Stored, Tier

log = logging.getLogger(__name__)

MEDIUM_TIERS = {
    "GPU": Tier.DEVICE,
    "DEVICE": Tier.DEVICE,
    "CPU": Tier.HOST,
    "CPU_PINNED": Tier.HOST,
    "CPU_TIER1": Tier.HOST,
    "CPU_TIER2": Tier.DISK,
    "DISK": Tier.DISK,
    "NVME": Tier.DISK,
    "STORAGE": Tier.DISK,
}

U64 = (1 << 64) - 1


def engine_block_id(block_hash: BlockHash) -> int:
    """vLLM's own int form of a bytes hash (its low 64 bits, big-endian), so
    an engine's ids agree whichever form it publishes."""
    if isinstance(block_hash, bytes):
        return int.from_bytes(block_hash, "big") & U64
    return block_hash & U64


class EventConverter:
    """Converts one engine's events; counts what it had to skip."""

    def __init__(
        self, block_size: int, namespace: str = "", kv_group: int = 0, *, model: str = ""
    ) -> None:
        self.block_size = block_size
        self.model = model
        self.salt = namespace
        self.namespace = model_namespace(model, namespace)
        self.kv_group = kv_group
        self.skipped: Counter[str] = Counter()

    def convert(self, events: list[WireEvent]) -> list[Event]:
        out: list[Event] = []
        for event in events:
            if isinstance(event, AllBlocksCleared):
                out.append(Cleared())
            elif not self._in_group(getattr(event, "group_idx", None)):
                self._skip("other_kv_group")
            elif (tier := self._tier(event.medium)) is None:
                self._skip("unknown_medium", event.medium)
            elif isinstance(event, BlockRemoved):
                out.append(Removed([engine_block_id(h) for h in event.block_hashes], tier))
            else:
                out.extend(self._stored(event, tier))
        return out

    def _stored(self, event: BlockStored, tier: Tier) -> list[Stored]:
        if event.block_size != self.block_size:
            self._skip("block_size_mismatch", event.block_size)
            return []
        ids = [engine_block_id(h) for h in event.block_hashes]
        parent = (
            None if event.parent_block_hash is None else engine_block_id(event.parent_block_hash)
        )
        distinct = set(ids) if parent is None else set(ids) | {parent}
        if len(distinct) != len(ids) + (parent is not None):
            self._skip("repeated_block_id")
            return []
        bs = self.block_size
        full = min(len(ids), len(event.token_ids) // bs)
        if full < len(ids):
            self._skip("missing_tokens")
        lora = (
            event.lora_name
            if isinstance(event.lora_name, str) and event.lora_name
            else (f"lora-{event.lora_id}" if isinstance(event.lora_id, int) else None)
        )
        base = self._adapter_namespace(lora) if lora else self.namespace
        extra = event.extra_keys if isinstance(event.extra_keys, list) else []
        namespaces = [
            _namespace(base, extra[i] if i < len(extra) else None, lora) for i in range(full)
        ]
        runs: list[Stored] = []
        start = 0
        for end in range(1, full + 1):
            if end == full or namespaces[end] != namespaces[start]:
                runs.append(
                    Stored(
                        ids[start:end],
                        event.token_ids[start * bs : end * bs],
                        parent=ids[start - 1] if start else parent,
                        tier=tier,
                        namespace=namespaces[start],
                    )
                )
                start = end
        return runs

    def _adapter_namespace(self, lora: str) -> str:
        if not self.model:
            return lora
        return model_namespace(f"{self.model}{ADAPTER_SEPARATOR}{lora}", self.salt)

    def _in_group(self, group: Any) -> bool:
        return not isinstance(group, int) or group == self.kv_group

    @staticmethod
    def _tier(medium: Any) -> Tier | None:
        if medium is None:
            return Tier.DEVICE
        return MEDIUM_TIERS.get(medium.upper()) if isinstance(medium, str) else None

    def _skip(self, reason: str, detail: Any = None) -> None:
        if not self.skipped[reason]:
            log.warning(
                "skipping vLLM events", extra={"fields": {"reason": reason, "detail": repr(detail)}}
            )
        self.skipped[reason] += 1


def _namespace(base: str, keys: Any, lora: str | None) -> str:
    if not isinstance(keys, (list, tuple)):
        return base
    rest = [key for key in keys if key != lora]
    if not rest:
        return base
    digest = hashlib.blake2b(msgspec.msgpack.encode(rest), digest_size=8).hexdigest()
    return f"{base}#{digest}"
