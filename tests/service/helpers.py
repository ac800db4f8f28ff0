"""Helpers shared by the service tests."""

from __future__ import annotations

import time

BLOCK = 16


def prompt(seed: int, blocks: int) -> list[int]:
    """A prompt of whole blocks whose tokens depend on `seed`."""
    return [seed * 1_000_003 + i for i in range(blocks * BLOCK)]


def wait_until(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    """Polls `predicate` (state changes that arrive asynchronously)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
