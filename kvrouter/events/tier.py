"""Where a worker keeps a block: the one tier type of the Python side.

Its values are the names the core's `Tier` accepts (the core takes either),
so a `Tier` goes to the index, to msgpack and to logs as it is; only the
protobuf enum needs a mapping (`kvrouter.events.proto`)."""

from __future__ import annotations

import enum


class Tier(enum.StrEnum):
    DEVICE = "device"
    HOST = "host"
    DISK = "disk"

    @classmethod
    def parse(cls, value: Tier | str) -> Tier:
        """A `Tier` from itself or its name in any case; ValueError otherwise."""
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise ValueError(
                f"unknown tier {value!r}; expected 'device', 'host' or 'disk'"
            ) from None
