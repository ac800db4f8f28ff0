"""Block hashes the way an engine makes them: chained sha256 over the tokens
from a random seed the router never learns (vLLM's default scheme)."""

from __future__ import annotations

import hashlib
import os

BS = 16


class EngineHasher:
    def __init__(self, as_bytes: bool) -> None:
        self.seed = os.urandom(32)
        self.as_bytes = as_bytes

    def hashes(self, tokens: list[int]) -> list[int | bytes]:
        out, parent = [], self.seed
        for start in range(0, len(tokens) - len(tokens) % BS, BS):
            block = b"".join(t.to_bytes(4, "little") for t in tokens[start : start + BS])
            parent = hashlib.sha256(parent + block).digest()
            out.append(parent if self.as_bytes else int.from_bytes(parent[:8], "big"))
        return out


def prompt(seed: int, blocks: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 50_000 for i in range(blocks * BS)]
