"""The tensor-parallel group a model shard belongs to."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from kvrouter.engine.parallel.all_reduce import AllReduce


@dataclass
class TensorParallelGroup:
    rank: int = 0
    size: int = 1
    all_reduce: AllReduce | None = None

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sums `x` over the group; a single-rank group returns it unchanged."""
        if self.size == 1:
            return x
        assert self.all_reduce is not None
        return self.all_reduce(x)

    def shard(self, total: int, what: str) -> int:
        if total % self.size:
            raise ValueError(f"{what} ({total}) is not divisible by tp_size {self.size}")
        return total // self.size


def init_tensor_parallel(
    rank: int, size: int, device: torch.device, init_method: str | None = None
) -> TensorParallelGroup:
    """Joins the default process group (gloo on CPU, NCCL on CUDA) and builds
    the all-reduce for `device`. A size-1 group needs no process group."""
    if size == 1:
        return TensorParallelGroup()
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size)
    return TensorParallelGroup(rank=rank, size=size, all_reduce=AllReduce(dist.group.WORLD, device))
