"""The registered workers: roles, addresses, heartbeats and whether their
index entries can be trusted. Keeps the policy's view of each worker in step.

A worker leaves routing and the index when it deregisters or misses
heartbeats for `heartbeat_ttl_s`. It is "stale" (not routable) while the
router waits for it to resync its KV events after a gap or a return.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from kvrouter._core import ADAPTER_SEPARATOR, PrefixIndex
from kvrouter.net.worker_protocol import (
    KV_TRANSFER_NONE,
    KVROUTER,
    check_address,
    check_kv_transfer,
)
from kvrouter.policy import Router
from kvrouter.roles import ROLES
from kvrouter.service.convert import check_model
from kvrouter.service.errors import already_exists, failed_precondition, invalid, not_found
from kvrouter.service.worker_ids import IdCounter, IdSource, check_worker_id, new_token

log = logging.getLogger("kvrouter.service.workers")

# What one registration may carry: every Route reply names an address, and
# List returns every worker's metadata, so one worker's oversized fields
# would cost every caller.
MAX_ADDRESS_CHARS = 512
MAX_METADATA_ENTRIES = 64
MAX_METADATA_CHARS = 16_384
# A model or adapter name; a request's model (`model:adapter`) is checked
# against the same limit.
MAX_MODEL_CHARS = 256
MAX_ADAPTERS = 64


@dataclass
class WorkerRecord:
    worker_id: int
    role: str
    address: str
    block_size: int
    capacity_blocks: int
    # The model it serves, as requests name it ("" : requests that name
    # none), and the adapters it serves on it.
    model: str = ""
    adapters: tuple[str, ...] = ()
    # What `address` speaks (kvrouter.net.worker_protocol).
    protocol: str = KVROUTER
    metadata: dict[str, str] = field(default_factory=dict)
    last_heartbeat: float = field(default_factory=time.monotonic)
    stale: bool = False
    queued_prefill_tokens: int = 0
    active_decode_blocks: int = 0
    active_requests: int = 0
    # Proves this registration (worker_ids.py); set when it is registered.
    token: int = 0
    # It streams its KV events here, so no stream means its cache is unseen.
    publishes_events: bool = False
    # How an OpenAI engine takes part in a split request
    # (kvrouter.net.worker_protocol), and SGLang's bootstrap port.
    kv_transfer: str = KV_TRANSFER_NONE
    bootstrap_port: int = 0
    # The engine's DP rank behind a shared address (sent as a header).
    data_parallel_rank: int | None = None


class WorkerTable:
    def __init__(
        self,
        router: Router,
        index: PrefixIndex,
        heartbeat_ttl_s: float,
        *,
        owns_index: bool = True,
        next_id: int = 0,
        ids: IdSource | None = None,
    ) -> None:
        """`next_id`: the next id to assign, as the index snapshot kept it.
        `ids` replaces the router's own counter: router replicas share one
        (kvrouter.service.replicas.shared_ids)."""
        self.router = router
        self.index = index
        self.ttl_s = heartbeat_ttl_s
        # A router replica's index follows the event stream alone, as every
        # replica's does; dropping a worker's entries here would set it apart.
        self.owns_index = owns_index
        self._workers: dict[int, WorkerRecord] = {}
        self._ids = ids or IdCounter(max(next_id, max(index.workers(), default=0) + 1))

    def __contains__(self, worker_id: int) -> bool:
        return worker_id in self._workers

    def __len__(self) -> int:
        return len(self._workers)

    def records(self) -> list[WorkerRecord]:
        return list(self._workers.values())

    def get(self, worker_id: int) -> WorkerRecord:
        record = self._workers.get(worker_id)
        if record is None:
            raise not_found(f"worker {worker_id} is not registered; register it first")
        return record

    def address(self, worker_id: int) -> str:
        record = self._workers.get(worker_id)
        return record.address if record is not None else ""

    def role(self, worker_id: int) -> str:
        record = self._workers.get(worker_id)
        return record.role if record is not None else ""

    def protocol(self, worker_id: int) -> str:
        record = self._workers.get(worker_id)
        return record.protocol if record is not None else ""

    def kv_transfer(self, worker_id: int) -> str:
        record = self._workers.get(worker_id)
        return record.kv_transfer if record is not None else KV_TRANSFER_NONE

    def data_parallel_rank(self, worker_id: int) -> int | None:
        record = self._workers.get(worker_id)
        return record.data_parallel_rank if record is not None else None

    @property
    def next_unused_id(self) -> int:
        return self._ids.next_unused

    async def next_id(self) -> int:
        """An id never assigned before, and not in use."""
        return await self._ids.take(lambda: self._workers.keys() | self.index.workers().keys())

    def proven(self, worker_id: int, token: int) -> WorkerRecord:
        """The worker's record, if `token` is its registration's."""
        record = self.get(worker_id)
        if token != record.token:
            raise failed_precondition(
                f"worker {worker_id} is registered by another process (or again since): "
                "this registration token is not its current one"
            )
        return record

    def register(self, record: WorkerRecord, token: int = 0) -> int:
        """Adds or updates a worker; returns the new registration's token.
        `token` is the one the worker holds from before, if any. One that
        returns after expiring starts with no index entries; its next event
        stream's hello asks for a resync."""
        check_worker_id(record.worker_id)
        if record.role not in ROLES:
            raise invalid(f"role must be one of {', '.join(ROLES)}")
        if record.block_size != self.index.block_size:
            raise invalid(
                f"worker block size {record.block_size} does not match the router's "
                f"{self.index.block_size}"
            )
        if record.capacity_blocks <= 0:
            raise invalid("capacity_blocks must be positive")
        _check_size(record)
        previous = self._workers.get(record.worker_id)
        if previous is not None and token and token != previous.token:
            raise already_exists(
                f"worker {record.worker_id} was registered by another process since this one's "
                "registration; it keeps the id (register without an id for a new one)"
            )
        if previous is not None:
            record.stale = previous.stale
        record.token = new_token()
        self.router.upsert_worker(
            record.worker_id,
            record.role,
            record.capacity_blocks,
            record.address,
            model=record.model,
            adapters=list(record.adapters),
        )
        self.router.set_healthy(record.worker_id, not record.stale)
        self._workers[record.worker_id] = record
        log.info(
            "worker registered",
            extra={
                "fields": {
                    "worker_id": record.worker_id,
                    "role": record.role,
                    "address": record.address,
                    "protocol": record.protocol,
                    "kv_transfer": record.kv_transfer,
                    "model": record.model,
                }
            },
        )
        return record.token

    def heartbeat(
        self, worker_id: int, token: int, queued: int, decode_blocks: int, requests: int
    ) -> None:
        record = self.proven(worker_id, token)
        record.last_heartbeat = time.monotonic()
        record.queued_prefill_tokens = queued
        record.active_decode_blocks = decode_blocks
        record.active_requests = requests
        self.router.report_load(worker_id, queued, decode_blocks, requests)

    def set_stale(self, worker_id: int, stale: bool) -> None:
        record = self._workers.get(worker_id)
        if record is not None and record.stale != stale:
            record.stale = stale
            self.router.set_healthy(worker_id, not stale)

    def remove(self, worker_id: int, reason: str) -> None:
        self.get(worker_id)
        del self._workers[worker_id]
        self.router.remove_worker(worker_id)
        self.drop_index_entries(worker_id)
        log.info("worker removed", extra={"fields": {"worker_id": worker_id, "reason": reason}})

    def drop_index_entries(self, worker_id: int) -> None:
        if self.owns_index and worker_id in self.index.workers():
            self.index.remove_worker(worker_id)

    def models(self) -> dict[str, int]:
        """Every model name served ("model", "model:adapter"; "" for workers
        that name none; an adapter's own name where exactly one model has
        it), with how many of its workers are routable now."""
        return dict(self.router.models())

    def canonical_model(self, model: str) -> str:
        """What a request for `model` means: "model:adapter" for an adapter
        it names by itself (vLLM serves one under its own name), where
        exactly one model has it; else `model` as it is. UnknownModel,
        naming them, where several models have it."""
        return self.router.canonical_model(model)

    def expire(self, now: float | None = None) -> list[int]:
        """Removes workers silent for longer than the TTL; returns their ids."""
        now = time.monotonic() if now is None else now
        lapsed = [w for w, r in self._workers.items() if now - r.last_heartbeat > self.ttl_s]
        for worker_id in lapsed:
            self.remove(worker_id, f"no heartbeat for {self.ttl_s:g}s")
        return lapsed


def _check_size(record: WorkerRecord) -> None:
    _check_model_name("model", record.model)
    if len(record.adapters) > MAX_ADAPTERS:
        raise invalid(f"{len(record.adapters)} adapters; the limit is {MAX_ADAPTERS}")
    for adapter in record.adapters:
        if not adapter:
            raise invalid("an adapter name is empty")
        _check_model_name("adapter", adapter)
    if record.adapters and not record.model:
        raise invalid("adapters need the model they run on (model)")
    if len(record.address) > MAX_ADDRESS_CHARS:
        raise invalid(
            f"address is {len(record.address)} characters; the limit is {MAX_ADDRESS_CHARS}"
        )
    try:
        check_address(record.protocol, record.address)
        check_kv_transfer(record.protocol, record.kv_transfer, record.role, record.bootstrap_port)
    except ValueError as e:
        raise invalid(str(e)) from None
    if len(record.metadata) > MAX_METADATA_ENTRIES:
        raise invalid(
            f"metadata has {len(record.metadata)} entries; the limit is {MAX_METADATA_ENTRIES}"
        )
    size = sum(len(k) + len(v) for k, v in record.metadata.items())
    if size > MAX_METADATA_CHARS:
        raise invalid(f"metadata is {size} characters; the limit is {MAX_METADATA_CHARS}")


def _check_model_name(field_name: str, name: str) -> None:
    """Requests ask for `model:adapter`, so neither part may hold the colon."""
    check_model(name, MAX_MODEL_CHARS, field_name)
    if ADAPTER_SEPARATOR in name:
        raise invalid(f"{field_name} {name!r} has a {ADAPTER_SEPARATOR!r}: it separates an adapter")
