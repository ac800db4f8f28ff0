"""One-shot all-reduce over torch symmetric memory (CUDA only).

Each rank copies its input into its own symmetric buffer; after a barrier
every rank sums all peers' buffers straight from their memory (one read of
each peer, no ring steps) and writes the result locally. A second barrier
keeps a fast rank from overwriting its buffer while a peer still reads it.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
import triton
import triton.language as tl

logger = logging.getLogger(__name__)

_BLOCK = 1024


@triton.jit
def _one_shot_all_reduce_kernel(
    buffer_ptrs,
    out_ptr,
    numel,
    WORLD_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    peer_ptrs = buffer_ptrs.to(tl.pointer_type(tl.uint64))
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for peer in tl.static_range(WORLD_SIZE):
        peer_buffer = tl.load(peer_ptrs + peer).to(tl.pointer_type(out_ptr.dtype.element_ty))
        acc += tl.load(peer_buffer + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=mask)


def one_shot_all_reduce(buffer_ptrs: int, out: torch.Tensor, world_size: int) -> torch.Tensor:
    """Writes into `out` the elementwise sum, accumulated in fp32, of the
    `world_size` buffers whose device addresses are the uint64s at device
    address `buffer_ptrs`; each buffer holds `out.numel()` elements of
    `out.dtype`. Returns `out`."""
    numel = out.numel()
    grid = (triton.cdiv(numel, _BLOCK),)
    _one_shot_all_reduce_kernel[grid](buffer_ptrs, out, numel, WORLD_SIZE=world_size, BLOCK=_BLOCK)
    return out


class SymmMemAllReduce:
    def __init__(self, group: dist.ProcessGroup, device: torch.device, max_bytes: int) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self.max_bytes = max_bytes
        self.world_size = dist.get_world_size(group)
        self.buffer = symm_mem.empty(max_bytes, dtype=torch.uint8, device=device)
        self.handle = symm_mem.rendezvous(self.buffer, group)

    @classmethod
    def try_create(
        cls, group: dist.ProcessGroup, device: torch.device, max_bytes: int
    ) -> SymmMemAllReduce | None:
        """None where symmetric memory is unavailable (no P2P, old torch): NCCL then
        handles every size."""
        try:
            return cls(group, device, max_bytes)
        except Exception as error:  # noqa: BLE001 - any failure means "use NCCL"
            logger.info("symmetric-memory all-reduce unavailable, using NCCL: %s", error)
            return None

    def fits(self, x: torch.Tensor) -> bool:
        return x.is_contiguous() and x.numel() * x.element_size() <= self.max_bytes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        numel = x.numel()
        staging = self.buffer[: numel * x.element_size()].view(x.dtype)
        staging.copy_(x.view(-1))
        self.handle.barrier(channel=0)
        out = one_shot_all_reduce(self.handle.buffer_ptrs_dev, torch.empty_like(x), self.world_size)
        self.handle.barrier(channel=0)
        return out
