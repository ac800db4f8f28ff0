"""Moving KV blocks from the prefill worker to the decode worker.

`KvTransfer` is the interface a decode worker pulls blocks through.
`GrpcKvTransfer`, the portable default, streams them over the source's
FetchBlocks RPC. A GPU-direct backend (NIXL, or NCCL send/recv) implements
the same `fetch` and leaves the rest of the hand-off unchanged.

On the wire each block travels as one slice per layer (its keys, then its
values), cut into chunks of at most `max_chunk_bytes`. The receiver checks
that every slice arrives whole and in order; the block hashes themselves are
checked against the request's tokens when the blocks are imported.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import grpc
import torch

from kvrouter.client.worker_channels import WorkerChannels
from kvrouter.engine import KvBlocks, KvLayout
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


def block_chunks(blocks: KvBlocks, max_chunk_bytes: int) -> Iterator[wpb.BlockChunk]:
    """What FetchBlocks streams: per block, per layer, keys then values."""
    _, num_layers, num_blocks = blocks.data.shape[:3]
    for index in range(num_blocks):
        block_id = blocks.block_ids[index]
        for layer in range(num_layers):
            data = _slice_bytes(blocks.data[:, layer, index])
            for offset in range(0, len(data), max_chunk_bytes):
                yield wpb.BlockChunk(
                    block_id=block_id,
                    layer=layer,
                    offset=offset,
                    data=data[offset : offset + max_chunk_bytes],
                )


def _slice_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().cpu().view(torch.uint8).numpy().tobytes()


class _Assembler:
    """Lays received slices out as KvBlocks.from_bytes expects:
    [2, layers, blocks, block_size, heads, head_dim]."""

    def __init__(self, block_ids: list[int], layout: KvLayout) -> None:
        self.block_ids = block_ids
        self.layout = layout
        self.half = layout.bytes_per_block // (2 * layout.num_layers)
        self.payload = bytearray(len(block_ids) * layout.bytes_per_block)
        self.expected = [
            (i, layer) for i in range(len(block_ids)) for layer in range(layout.num_layers)
        ]
        self.position = 0  # index into expected
        self.offset = 0  # bytes of the current slice received

    def add(self, chunk: wpb.BlockChunk) -> None:
        if self.position >= len(self.expected):
            raise TransferError("more KV data than the blocks requested")
        index, layer = self.expected[self.position]
        if (
            chunk.block_id != self.block_ids[index]
            or chunk.layer != layer
            or chunk.offset != self.offset
            or self.offset + len(chunk.data) > 2 * self.half
        ):
            raise TransferError(
                f"unexpected chunk (block {chunk.block_id}, layer {chunk.layer}, offset "
                f"{chunk.offset}); expected block {self.block_ids[index]}, layer {layer}, "
                f"offset {self.offset}"
            )
        for part, start, end in self._places(index, layer, len(chunk.data)):
            self.payload[start:end] = chunk.data[part : part + end - start]
        self.offset += len(chunk.data)
        if self.offset == 2 * self.half:
            self.position += 1
            self.offset = 0

    def _places(self, index: int, layer: int, length: int):
        """(offset into the chunk, start, end in the payload) for the key and
        value parts the chunk covers."""
        num_layers, num_blocks = self.layout.num_layers, len(self.block_ids)
        begin, stop = self.offset, self.offset + length
        for kv in (0, 1):
            lo, hi = max(begin, kv * self.half), min(stop, (kv + 1) * self.half)
            if lo < hi:
                base = ((kv * num_layers + layer) * num_blocks + index) * self.half
                yield lo - begin, base + lo - kv * self.half, base + hi - kv * self.half

    def finish(self) -> FetchedBlocks:
        if self.position != len(self.expected):
            raise TransferError(
                f"the stream ended after {self.position} of {len(self.expected)} block layers"
            )
        blocks = KvBlocks.from_bytes(self.block_ids, bytes(self.payload), self.layout)
        return FetchedBlocks(blocks, len(self.payload))


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
