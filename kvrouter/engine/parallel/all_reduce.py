"""Sum a tensor over the tensor-parallel group.

- CPU: gloo.
- CUDA, small tensors: a one-shot Triton all-reduce over torch symmetric
  memory. Every rank reads every peer's buffer directly over NVLink, which
  beats NCCL's ring at decode-sized messages (a few hundred KB and below).
- CUDA, large tensors (or no symmetric memory): NCCL.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# One-shot reads world_size × the message per rank; past this NCCL's ring wins.
SYMM_MEM_MAX_BYTES = 512 * 1024


class AllReduce:
    def __init__(self, group: dist.ProcessGroup, device: torch.device) -> None:
        self.group = group
        self.device = device
        self.symm_mem = None
        if device.type == "cuda":
            from kvrouter.engine.parallel.symm_mem_all_reduce import SymmMemAllReduce

            self.symm_mem = SymmMemAllReduce.try_create(group, device, SYMM_MEM_MAX_BYTES)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.symm_mem is not None and self.symm_mem.fits(x):
            return self.symm_mem(x)
        dist.all_reduce(x, group=self.group)
        return x
