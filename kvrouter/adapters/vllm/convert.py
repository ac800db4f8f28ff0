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
- A cache salt puts a sequence in the salted namespace a request with that
  salt is looked up in (`model_namespace(model, salt)`, the adapter's name
  for `model` under a LoRA): vLLM's is the bare string in the extra keys of
  a sequence's first block, which every later block inherits through the
  chain (chains.py); SGLang's (`metadata.cache_salt`) salts every block of
  its event. An engine with a salt of its own (`namespace`) has no request
  namespace for a second salt: its salted blocks match nothing.
- A block whose `extra_keys` carry anything else (multimodal hashes,
  prompt-embedding digests) or a speculative engine's lookahead tokens
  (`lookahead_token_ids`: the tokens after each block that went into its
  hash) is not determined by its tokens alone. It hashes in a namespace
  derived from those keys, so it and every block after it never match a
  query made of the same tokens.
- Offloading placeholders (a block's hash, no tokens, `block_size` 0) are
  skipped: the router cannot place a block whose tokens it does not know.
- Hybrid models (KV cache groups of full attention beside sliding-window,
  mamba or chunked local attention ones, hybrid.py): a prefix is counted as
  far as vLLM's hybrid lookup reuses it (every full-attention group holds
  it whole, every sliding-window group the window before its end, every
  mamba group the state at its end). From the first batch that shows them,
  the engine's workers are cleared and indexed so; offloaded tiers are then
  not indexed. Groups of any other kind (cross attention, ...) are not
  indexed at all: the first such event clears the worker, and the engine's
  events are skipped from then on.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from typing import Any

import msgspec

from kvrouter._core import ADAPTER_SEPARATOR, model_namespace
from kvrouter.adapters.vllm.chains import ChainNamespaces
from kvrouter.adapters.vllm.holds import OffloadedHolds
from kvrouter.adapters.vllm.hybrid import (
    FULL_KINDS,
    STATE_KINDS,
    WINDOW_KINDS,
    HybridBlocks,
    end_rule,
)
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
        self,
        block_size: int,
        namespace: str = "",
        *,
        model: str = "",
        attention_chunk_size: int = 0,
    ) -> None:
        self.block_size = block_size
        self.attention_chunk_size = attention_chunk_size
        self.model = model
        self.salt = namespace
        self.namespace = model_namespace(model, namespace)
        # Groups of a kind that is not indexed: nothing of the engine's is.
        self.unindexed = False
        # Groups that are (hybrid.py): each worker's blocks per group.
        self.grouped = False
        self.hybrids: dict[int, HybridBlocks] = {}
        self.skipped: Counter[str] = Counter()
        self.offloaded = OffloadedHolds()
        self.chains = ChainNamespaces()

    def convert(self, events: list[WireEvent], worker: int, *, fresh: bool = False) -> list[Event]:
        """One batch of `worker`'s events; `fresh`: the batch starts the
        worker anew (a resync)."""
        if fresh:
            self.forget(worker)
        out: list[Event] = []
        if not self.unindexed and any(_unindexed_kind(event) for event in events):
            self.unindexed = True
            log.warning("a KV cache group of a kind not indexed: none of the engine's blocks are")
        if self.unindexed:
            self.forget(worker)
            self._skip("hybrid_kv_groups")
            return [Cleared()]
        out += self._hybrid_batch(events, worker)
        for event in events:
            hybrid = self.hybrids.get(worker)
            if isinstance(event, AllBlocksCleared):
                self.forget(worker)
                out.append(Cleared())
            elif (tier := self._tier(event.medium)) is None:
                self._skip("unknown_medium", event.medium)
            elif hybrid is not None and tier != Tier.DEVICE:
                self._skip("hybrid_offloaded")
            elif isinstance(event, BlockRemoved):
                ids = self.offloaded.removed(worker, tier, map(engine_block_id, event.block_hashes))
                self.chains.removed(worker, ids)
                if hybrid is not None:
                    out += hybrid.removed(event.group_idx or 0, ids)
                elif ids:
                    out.append(Removed(ids, tier))
            elif event.placeholder:
                self._skip("offload_placeholder")
            elif hybrid is not None and event.kv_cache_spec_kind in STATE_KINDS:
                ids = [engine_block_id(h) for h in event.block_hashes]
                out += hybrid.holds(event.group_idx or 0, ids)
            else:
                stored = self._stored(event, tier, worker)
                if hybrid is not None:
                    out += hybrid.stored(event.group_idx or 0, stored)
                    continue
                for run in stored:
                    self.offloaded.stored(worker, tier, run.block_ids)
                out.extend(stored)
        return out

    def _hybrid_batch(self, events: list[WireEvent], worker: int) -> list[Event]:
        """A hybrid engine's worker (hybrid.py): cleared at its first batch
        once the engine has shown its groups (what was indexed before may
        lack some), then told the groups of each batch."""
        if not self.grouped and any(_grouped(event) for event in events):
            self.grouped = True
            log.info("hybrid KV cache groups: a prefix counts as far as every group can reuse it")
        out: list[Event] = []
        if self.grouped and worker not in self.hybrids:
            self.forget(worker)
            self.hybrids[worker] = HybridBlocks()
            out.append(Cleared())
        if worker in self.hybrids:
            groups = {
                e.group_idx or 0: end_rule(
                    e.kv_cache_spec_kind,
                    e.kv_cache_spec_sliding_window,
                    self.block_size,
                    self.attention_chunk_size,
                )
                for e in events
                if isinstance(e, BlockStored)
            }
            out += self.hybrids[worker].know(groups)
        return out

    def forget(self, worker: int) -> None:
        """What the converter knows of the worker's blocks: the worker is
        starting anew."""
        self.offloaded.forget(worker)
        self.chains.forget(worker)
        if worker in self.hybrids:
            self.hybrids[worker] = HybridBlocks()

    def _stored(self, event: BlockStored, tier: Tier, worker: int) -> list[Stored]:
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
        namespaces = self._namespaces(event, full, base, lora, worker, parent)
        for block, namespace in zip(ids, namespaces, strict=False):
            if namespace != base:
                self.chains.stored(worker, block, namespace)
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

    def _namespaces(
        self,
        event: BlockStored,
        full: int,
        base: str,
        lora: str | None,
        worker: int,
        parent: int | None,
    ) -> list[str]:
        """Each of the event's first `full` blocks' namespace: its parent's,
        salted or keyed by what went into its own hash."""
        chain = self.chains.of(worker, parent) or base
        out = []
        for i in range(full):
            keys = _extra_keys(event, i, lora)
            salt = event.cache_salt
            if salt is None and i == 0 and parent is None:
                salt, keys = _vllm_salt(keys)
            if salt is not None:
                chain = self._salted(base, lora, salt)
            if keys:
                chain = _keyed(chain, keys)
            out.append(chain)
        return out

    def _salted(self, base: str, lora: str | None, salt: str) -> str:
        """Where a request for the engine's model (or its adapter) with the
        cache salt `salt` is looked up; a namespace no request names where
        there is none (the engine's own salt, an adapter of an engine that
        names no model, an empty salt)."""
        if self.salt or not salt or (lora and not self.model):
            return _keyed(base, [salt])
        model = f"{self.model}{ADAPTER_SEPARATOR}{lora}" if lora else self.model
        return model_namespace(model, salt)

    def _adapter_namespace(self, lora: str) -> str:
        if not self.model:
            return lora
        return model_namespace(f"{self.model}{ADAPTER_SEPARATOR}{lora}", self.salt)

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


def _unindexed_kind(event: WireEvent) -> bool:
    return isinstance(event, BlockStored) and event.kv_cache_spec_kind not in (
        *FULL_KINDS,
        *WINDOW_KINDS,
    )


def _grouped(event: WireEvent) -> bool:
    """Of a KV cache group beside group 0, or of a window group."""
    if isinstance(event, AllBlocksCleared):
        return False
    if event.group_idx not in (None, 0):
        return True
    return isinstance(event, BlockStored) and event.kv_cache_spec_kind in WINDOW_KINDS


def _extra_keys(event: BlockStored, i: int, lora: str | None) -> list[Any]:
    """What besides its tokens (and its LoRA name) went into block `i`'s hash."""
    keys = (
        event.extra_keys[i]
        if isinstance(event.extra_keys, list) and i < len(event.extra_keys)
        else None
    )
    keys = list(keys) if isinstance(keys, (list, tuple)) else []
    if lora is not None and lora in keys:
        keys.remove(lora)
    lookahead = event.lookahead_token_ids
    if lookahead is not None and i < len(lookahead):
        keys.append(["lookahead", lookahead[i]])
    return keys


def _vllm_salt(keys: list[Any]) -> tuple[str | None, list[Any]]:
    """vLLM's cache salt among a first block's keys (the one bare string
    once the LoRA name is out: multimodal keys are pairs, prompt-embedding
    digests bytes), and the keys besides it."""
    salts = [key for key in keys if isinstance(key, str)]
    if len(salts) != 1:
        return None, keys
    rest = list(keys)
    rest.remove(salts[0])
    return salts[0], rest


def _keyed(base: str, keys: list[Any]) -> str:
    digest = hashlib.blake2b(msgspec.msgpack.encode(keys), digest_size=8).hexdigest()
    return f"{base}#{digest}"
