"""Moving KV blocks from the prefill worker to the decode worker.

`KvTransfer` is the interface a decode worker pulls blocks through.
`GrpcKvTransfer`, the portable default, streams them over the source's
FetchBlocks RPC. A GPU-direct backend (NIXL, or NCCL send/recv) implements
the same `fetch` and leaves the rest of the hand-off unchanged.

On the wire the blocks travel in stream order (block by block, layer by
layer, keys then values) as one byte stream, cut into chunks of at most
`max_chunk_bytes`; each chunk names the block, layer and offset it starts
at. The receiver checks that the chunks arrive in order and add up to the
blocks asked for; the block hashes themselves are checked against the
request's tokens when the blocks are imported.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import grpc
import torch

from kvrouter.engine import KvBlocks, KvLayout
from kvrouter.net.worker_channels import WorkerChannels
from kvrouter.proto_gen import worker_pb2 as wpb


class TransferError(Exception):
    """The source could not deliver the blocks (it failed, or sent garbage)."""


@dataclass
class FetchedBlocks:
    blocks: KvBlocks
    num_bytes: int


class KvTransfer(Protocol):
    async def fetch(
        self,
        source: str,
        request_id: str,
        block_ids: list[int],
        layout: KvLayout,
        timeout: float | None,
    ) -> FetchedBlocks:
        """The KV of `block_ids`, pinned on `source` under `request_id`.
        Raises TransferError."""


def _stream_order(data: torch.Tensor) -> torch.Tensor:
    """[2, layers, blocks, ...] -> [blocks, layers, 2, ...]: block by block,
    layer by layer, keys then values."""
    return data.permute(2, 1, 0, 3, 4, 5)


def _stream_position(layout: KvLayout, at: int) -> tuple[int, int, int]:
    """Where byte `at` of the stream falls: (block index, layer, offset
    within that block's layer)."""
    index, within = divmod(at, layout.bytes_per_block)
    layer, offset = divmod(within, layout.bytes_per_block // layout.num_layers)
    return index, layer, offset


def block_chunks(blocks: KvBlocks, max_chunk_bytes: int) -> Iterator[wpb.BlockChunk]:
    """What FetchBlocks streams: the blocks' bytes in stream order, cut into
    chunks that each name the (block, layer, offset) they start at."""
    payload = _stream_order(blocks.data).contiguous().cpu().view(torch.uint8).numpy().tobytes()
    for start in range(0, len(payload), max_chunk_bytes):
        index, layer, offset = _stream_position(blocks.layout, start)
        yield wpb.BlockChunk(
            block_id=blocks.block_ids[index],
            layer=layer,
            offset=offset,
            data=payload[start : start + max_chunk_bytes],
        )


class _Assembler:
    """Checks that chunks arrive in stream order and whole, then rebuilds the
    KvBlocks layout [2, layers, blocks, block_size, heads, head_dim]."""

    def __init__(self, block_ids: list[int], layout: KvLayout) -> None:
        self.block_ids = block_ids
        self.layout = layout
        self.total = len(block_ids) * layout.bytes_per_block
        self.payload = bytearray()

    def add(self, chunk: wpb.BlockChunk) -> None:
        index, layer, offset = _stream_position(self.layout, len(self.payload))
        if index >= len(self.block_ids) or len(self.payload) + len(chunk.data) > self.total:
            raise TransferError("more KV data than the blocks requested")
        if (chunk.block_id, chunk.layer, chunk.offset) != (self.block_ids[index], layer, offset):
            raise TransferError(
                f"unexpected chunk (block {chunk.block_id}, layer {chunk.layer}, offset "
                f"{chunk.offset}); expected block {self.block_ids[index]}, layer {layer}, "
                f"offset {offset}"
            )
        self.payload += chunk.data

    def finish(self) -> FetchedBlocks:
        if len(self.payload) != self.total:
            raise TransferError(f"the stream ended after {len(self.payload)} of {self.total} bytes")
        two, num_layers, block_size, heads, head_dim = self.layout.block_shape
        raw = torch.frombuffer(self.payload, dtype=torch.uint8).view(
            getattr(torch, self.layout.dtype)
        )
        ordered = raw.view(len(self.block_ids), num_layers, two, block_size, heads, head_dim)
        data = ordered.permute(2, 1, 0, 3, 4, 5).contiguous()
        return FetchedBlocks(KvBlocks(list(self.block_ids), data), self.total)


class GrpcKvTransfer:
    """Pulls blocks over the source worker's FetchBlocks stream."""

    def __init__(self, channels: WorkerChannels, max_chunk_bytes: int = 1 << 20) -> None:
        self.channels = channels
        self.max_chunk_bytes = max_chunk_bytes

    async def fetch(
        self,
        source: str,
        request_id: str,
        block_ids: list[int],
        layout: KvLayout,
        timeout: float | None,
    ) -> FetchedBlocks:
        request = wpb.FetchBlocksRequest(
            request_id=request_id, block_ids=block_ids, max_chunk_bytes=self.max_chunk_bytes
        )
        assembler = _Assembler(list(block_ids), layout)
        call = self.channels.stub(source).FetchBlocks(request, timeout=timeout)
        try:
            async for chunk in call:
                assembler.add(chunk)
        except grpc.RpcError as e:
            raise TransferError(f"{source}: {e.code().name}: {e.details()}") from None
        finally:
            call.cancel()
        return assembler.finish()
