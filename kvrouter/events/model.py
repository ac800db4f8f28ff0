"""KV events as plain frozen data: what engines report, what the publishers
number and send, and what the router applies.

They mirror the core's `Stored`, `Removed`, `EndsReusable` and `Cleared`
(which the index takes, and which cannot be read back or encoded):
`kvrouter.events.core` converts to those, `kvrouter.events.proto` to and
from the gRPC messages and `kvrouter.adapters.nats.codec` to and from
msgpack.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field

from kvrouter.events.tier import Tier


@dataclass(frozen=True, slots=True)
class Stored:
    """Consecutive blocks of one sequence after `parent` (engine block ids),
    with their tokens (block_size per block; the router hashes them itself)
    or, from engines that keep no tokens, their router-compatible
    `local_hashes`."""

    block_ids: tuple[int, ...]
    token_ids: tuple[int, ...] = ()
    _: KW_ONLY
    parent: int | None = None
    tier: Tier = Tier.DEVICE
    namespace: str = ""
    local_hashes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "block_ids", tuple(self.block_ids))
        object.__setattr__(self, "token_ids", tuple(self.token_ids))
        object.__setattr__(self, "local_hashes", tuple(self.local_hashes))
        object.__setattr__(self, "tier", Tier.parse(self.tier))


@dataclass(frozen=True, slots=True)
class Removed:
    """Blocks that left one tier of the worker's cache."""

    block_ids: tuple[int, ...]
    tier: Tier = Tier.DEVICE

    def __post_init__(self) -> None:
        object.__setattr__(self, "block_ids", tuple(self.block_ids))
        object.__setattr__(self, "tier", Tier.parse(self.tier))


@dataclass(frozen=True, slots=True)
class EndsReusable:
    """Blocks the worker holds, marked as ends a reused prefix may stop at
    (`reusable`) or not. A stored block is one. A hybrid engine marks the
    blocks whose sliding-window group lacks the window before them: it
    reuses a prefix only as far as the deepest end it holds."""

    block_ids: tuple[int, ...]
    reusable: bool

    def __post_init__(self) -> None:
        object.__setattr__(self, "block_ids", tuple(self.block_ids))


@dataclass(frozen=True, slots=True)
class Cleared:
    """The worker dropped its whole cache."""


Event = Stored | Removed | EndsReusable | Cleared


@dataclass(frozen=True, slots=True)
class WorkerBatch:
    """Batch `seq` of one worker's gap-free stream. With `resync`, the events
    are the worker's whole cache and replace what the receiver knows of it.
    `emitted_at` (Unix time the batch was cut, for the event-lag metric) is
    not part of its value."""

    worker_id: int
    seq: int
    events: tuple[Event, ...] = ()
    resync: bool = False
    emitted_at: float = field(default=0.0, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", tuple(self.events))
