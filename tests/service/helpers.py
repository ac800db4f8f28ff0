"""Helpers shared by the service tests."""

from __future__ import annotations

BLOCK = 16


def prompt(seed: int, blocks: int) -> list[int]:
    """A prompt of whole blocks whose tokens depend on `seed`."""
    return [seed * 1_000_003 + i for i in range(blocks * BLOCK)]
