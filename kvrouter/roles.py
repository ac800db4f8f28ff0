"""What a worker does in a request: prefill it, decode it, or both
(aggregated serving, no hand-off)."""

from __future__ import annotations

from typing import Literal, get_args

Role = Literal["prefill", "decode", "both"]
ROLES: tuple[Role, ...] = get_args(Role)
