"""Tensor-parallel linear layers.

A column-parallel layer splits its output features across ranks; a
row-parallel one splits its input features and sums the partial products
with an all-reduce. Attention and MLP are each one column-parallel layer
followed by one row-parallel layer, so each costs a single all-reduce.

Each layer knows how to take its slice of a full checkpoint tensor
(`load`), so checkpoints stay unsharded on disk.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvrouter.engine.parallel import TensorParallelGroup


class ColumnParallelLinear(nn.Module):
    """Concatenated output segments (e.g. q, k, v), each split across ranks."""

    def __init__(
        self,
        in_features: int,
        segment_sizes: list[int],
        bias: bool,
        tp: TensorParallelGroup,
    ) -> None:
        super().__init__()
        self.tp = tp
        self.local_sizes = [tp.shard(size, "output features") for size in segment_sizes]
        self.weight = nn.Parameter(torch.empty(sum(self.local_sizes), in_features))
        self.bias = nn.Parameter(torch.empty(sum(self.local_sizes))) if bias else None

    def load(self, segment: int, name: str, tensor: torch.Tensor) -> None:
        """Copies this rank's slice of the full tensor of output segment `segment`."""
        size = self.local_sizes[segment]
        local = tensor.narrow(0, self.tp.rank * size, size)
        start = sum(self.local_sizes[:segment])
        target = self.weight if name == "weight" else self.bias
        target.data.narrow(0, start, size).copy_(local)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    def __init__(
        self, in_features: int, out_features: int, bias: bool, tp: TensorParallelGroup
    ) -> None:
        super().__init__()
        self.tp = tp
        self.local_in = tp.shard(in_features, "input features")
        self.weight = nn.Parameter(torch.empty(out_features, self.local_in))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def load(self, segment: int, name: str, tensor: torch.Tensor) -> None:
        if name == "bias":
            self.bias.data.copy_(tensor)
            return
        self.weight.data.copy_(tensor.narrow(1, self.tp.rank * self.local_in, self.local_in))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.tp.reduce(F.linear(x, self.weight))
        # The bias is added once, after the sum, not once per rank.
        return out if self.bias is None else out + self.bias
