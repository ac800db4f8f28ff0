"""FetchBlocks' wire format: chunking and reassembly, including chunks that
straddle the key/value boundary, and refusal of malformed streams."""

from __future__ import annotations

import pytest
import torch

from kvrouter.engine import KvBlocks
from kvrouter.worker.transfer import TransferError, _Assembler, block_chunks


def _blocks(num_blocks: int = 3, dtype=torch.float16) -> KvBlocks:
    data = torch.randn(2, 2, num_blocks, 4, 2, 8).to(dtype)
    return KvBlocks([100 + i for i in range(num_blocks)], data)


@pytest.mark.parametrize("chunk_bytes", [1 << 20, 256, 100, 7])
def test_chunks_reassemble_to_the_same_blocks(chunk_bytes):
    blocks = _blocks()
    assembler = _Assembler(blocks.block_ids, blocks.layout)
    for chunk in block_chunks(blocks, chunk_bytes):
        assert len(chunk.data) <= chunk_bytes
        assembler.add(chunk)
    fetched = assembler.finish()
    assert fetched.num_bytes == 3 * blocks.layout.bytes_per_block
    assert fetched.blocks.block_ids == blocks.block_ids
    assert torch.equal(fetched.blocks.data, blocks.data)


def test_a_short_stream_is_refused():
    blocks = _blocks()
    assembler = _Assembler(blocks.block_ids, blocks.layout)
    for chunk in list(block_chunks(blocks, 64))[:-1]:
        assembler.add(chunk)
    with pytest.raises(TransferError, match="ended after"):
        assembler.finish()


def test_out_of_order_or_foreign_chunks_are_refused():
    blocks = _blocks()
    chunks = list(block_chunks(blocks, 64))
    with pytest.raises(TransferError, match="unexpected chunk"):
        _Assembler(blocks.block_ids, blocks.layout).add(chunks[1])
    chunks[0].block_id = 7
    with pytest.raises(TransferError, match="unexpected chunk"):
        _Assembler(blocks.block_ids, blocks.layout).add(chunks[0])
