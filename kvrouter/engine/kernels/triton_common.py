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
