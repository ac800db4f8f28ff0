"""vLLM's `kv_transfer_params` P/D protocol, on the worker's own KV
transfer (docs/disaggregation.md): what a router in vLLM's proxy role
(service/engine_split/vllm.py) drives.

- Prefill: a request with `do_remote_decode` runs as asked (the proxy asks
  for one token); when it finishes, its prompt's full blocks are pinned
  under a lease named by the request's id, and the answer's
  `kv_transfer_params` say where to fetch them: `remote_host` and
  `remote_port` (this worker's gRPC address), `remote_request_id` (the
  lease), `remote_block_ids` (the blocks' hashes) and `remote_engine_id`.
- Decode: a request with `do_remote_prefill` first pins what this worker
  already holds of those blocks, fetches the rest over the prefill
  worker's FetchBlocks, imports them, releases the prefill worker's lease,
  then runs the whole request, which now finds its prompt cached. A
  hand-off that cannot be used (another namespace, the prefill worker
  gone, its lease lapsed) is logged and the prompt prefilled here: the
  answer is the same either way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import grpc

from kvrouter.net.worker_channels import WorkerChannels
from kvrouter.proto_gen import worker_pb2 as wpb
from kvrouter.worker.decode import Pins, import_pinned
from kvrouter.worker.engine_loop import EngineLoop, FinishHook, Hook
from kvrouter.worker.leases import LeaseTable
from kvrouter.worker.requests import Identity
from kvrouter.worker.transfer import KvTransfer, TransferError

log = logging.getLogger("kvrouter.worker.engine_mode.handoff")


@dataclass(frozen=True)
class RemotePrefill:
    """Where a decode fetches its prompt's blocks from."""

    source: str
    request_id: str
    block_ids: list[int]

    @classmethod
    def parse(cls, params: dict) -> RemotePrefill:
        """ValueError names what is missing or wrong."""
        host, port = params.get("remote_host"), params.get("remote_port")
        request_id = params.get("remote_request_id")
        block_ids = params.get("remote_block_ids")
        if not isinstance(host, str) or not host or type(port) is not int:
            raise ValueError("remote_host and remote_port name the prefill worker")
        if not isinstance(request_id, str) or not request_id:
            raise ValueError("remote_request_id names the hand-off")
        if not isinstance(block_ids, list) or not all(type(b) is int for b in block_ids):
            raise ValueError("remote_block_ids is a list of block ids")
        return cls(f"{host}:{port}", request_id, block_ids)


class Handoffs:
    def __init__(
        self,
        engine: EngineLoop,
        leases: LeaseTable,
        transfer: KvTransfer,
        channels: WorkerChannels,
        identity: Identity,
        fetch_timeout_s: float,
    ) -> None:
        self.engine = engine
        self.leases = leases
        self.transfer = transfer
        self.channels = channels
        self.identity = identity
        # Bounds a fetch, and a release.
        self.fetch_timeout_s = fetch_timeout_s
        self._background: set[asyncio.Task] = set()

    # -- the prefill side

    def pin_when_done(self, request_id: str, prompt: list[int]) -> FinishHook:
        """The request's finish hook: pins its prompt's blocks under a lease
        (on the engine thread, in the step that filled them)."""

        def pin(engine, seq) -> None:
            self.leases.add(request_id, engine.pin_blocks(engine.block_ids(prompt)))

        return pin

    def answer(self, request_id: str) -> dict:
        """The `kv_transfer_params` a finished prefill answers with."""
        lease = self.leases.get(request_id)
        host, _, port = self.identity.address.rpartition(":")
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": lease.block_ids if lease is not None else [],
            "remote_engine_id": f"kvrouter-{self.identity.address}",
            "remote_request_id": request_id,
            "remote_host": host,
            "remote_port": int(port),
            "tp_size": 1,
        }

    # -- the decode side

    async def fetch(self, prompt: list[int], params: dict) -> Hook | None:
        """Brings the hand-off's blocks into this worker's cache, pinned
        until the request is scheduled: the returned hook unpins them. None
        when nothing could be brought (the prompt is prefilled here)."""
        try:
            remote = RemotePrefill.parse(params)
        except ValueError as e:
            log.warning("unusable kv_transfer_params; prefilling", extra=_fields(error=str(e)))
            return None
        pins = Pins()
        try:
            return await self._fetch(prompt, remote, pins)
        except BaseException:
            self.engine.post(pins.release)
            raise
        finally:
            self._release_later(remote)

    async def _fetch(self, prompt: list[int], remote: RemotePrefill, pins: Pins) -> Hook | None:
        started = time.perf_counter()
        own = await self.engine.call(lambda engine: engine.block_ids(prompt))
        if own[: len(remote.block_ids)] != remote.block_ids:
            log.warning(
                "the hand-off's blocks are not this worker's hashes of the prompt; prefilling",
                extra=_fields(request_id=remote.request_id),
            )
            return None
        held = await self.engine.call(pins.pin, remote.block_ids)
        missing = remote.block_ids[len(held) :]
        if missing:
            try:
                fetched = await self.transfer.fetch(
                    remote.source,
                    remote.request_id,
                    missing,
                    self.engine.engine.kv_layout,
                    self.fetch_timeout_s,
                )
                await self.engine.call(import_pinned, prompt, fetched.blocks, pins)
            except (TransferError, ValueError, RuntimeError) as e:
                log.warning(
                    "could not fetch the hand-off; prefilling the rest",
                    extra=_fields(request_id=remote.request_id, error=str(e)),
                )
                return pins.release
        log.info(
            "hand-off fetched",
            extra=_fields(
                request_id=remote.request_id,
                source=remote.source,
                blocks_reused=len(held),
                blocks_transferred=len(missing),
                transfer_ms=(time.perf_counter() - started) * 1000.0,
            ),
        )
        return pins.release

    def _release_later(self, remote: RemotePrefill) -> None:
        """Unpins the hand-off on the prefill worker, without waiting (its
        lease's TTL covers a release that never arrives)."""

        async def release() -> None:
            try:
                await self.channels.stub(remote.source).Release(
                    wpb.ReleaseRequest(request_id=remote.request_id),
                    timeout=self.fetch_timeout_s,
                )
            except grpc.RpcError as e:
                log.info(
                    "release failed; the lease will lapse",
                    extra=_fields(request_id=remote.request_id, code=e.code().name),
                )

        task = asyncio.ensure_future(release())
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _fields(**fields) -> dict:
    return {"fields": fields}
