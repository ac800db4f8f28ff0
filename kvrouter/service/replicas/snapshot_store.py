"""A replica's index snapshot together with the stream position it covers,
written atomically so that a crash leaves the previous one intact."""

from __future__ import annotations

import os
from pathlib import Path

_MAGIC = b"KVRS1\n"


def save_snapshot(path: Path, stream_seq: int, snapshot: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as out:
        out.write(_MAGIC + stream_seq.to_bytes(8, "big") + snapshot)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def load_snapshot(path: Path) -> tuple[int, bytes] | None:
    """(stream position, index snapshot), or None when there is none yet."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + 8:
        raise ValueError(f"{path} is not a kvrouter replica snapshot")
    start = len(_MAGIC)
    return int.from_bytes(data[start : start + 8], "big"), data[start + 8 :]
