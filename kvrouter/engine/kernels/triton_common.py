"""Settings shared by the Triton kernels."""

from __future__ import annotations

import os

import torch


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def upcast_dots(dtype: torch.dtype) -> bool:
    """Whether tl.dot operands go to fp32 first: always for fp32 caches (exact
    IEEE products, not TF32), and for bf16 under the interpreter, whose bf16
    dot gives wrong results."""
    return dtype == torch.float32 or (interpreting() and dtype == torch.bfloat16)


def pad_pow2(n: int, minimum: int = 16) -> int:
    """tl.arange needs powers of two and tl.dot needs dimensions of at least 16."""
    return max(minimum, 1 << (n - 1).bit_length())


def launch_options(num_warps: int | None, num_stages: int | None) -> dict[str, int]:
    """A kernel launch's overrides of Triton's default warps and pipeline stages."""
    options = {"num_warps": num_warps, "num_stages": num_stages}
    return {name: value for name, value in options.items() if value is not None}
