"""The namespace of each block whose chain left its event's plain one.

vLLM hashes a cache salt (and multimodal keys) into a block's extra keys,
and every later block of the sequence inherits it through the hash chain
without naming it again: a salted prompt's third block, stored in a later
step, arrives with no extra keys and its salted parent's hash. So the
converter remembers the namespace of every block it put outside its
event's plain namespace, for the children that come after, until the
block is removed or the worker cleared. A child whose parent it no longer
knows falls back to the plain namespace, whose chain then matches
nothing: a lost reuse, never a false one.
"""

from __future__ import annotations

from collections.abc import Iterable


class ChainNamespaces:
    def __init__(self) -> None:
        self._namespaces: dict[int, dict[int, str]] = {}

    def of(self, worker: int, block: int | None) -> str | None:
        if block is None:
            return None
        return self._namespaces.get(worker, {}).get(block)

    def stored(self, worker: int, block: int, namespace: str) -> None:
        self._namespaces.setdefault(worker, {})[block] = namespace

    def removed(self, worker: int, blocks: Iterable[int]) -> None:
        known = self._namespaces.get(worker)
        if known:
            for block in blocks:
                known.pop(block, None)

    def forget(self, worker: int) -> None:
        self._namespaces.pop(worker, None)
