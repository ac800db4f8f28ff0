"""Index snapshot files, for the router and its replicas alike.

A snapshot is written to a temporary file in the same directory, flushed to
disk and renamed over the old one, so a crash mid-write leaves the previous
snapshot whole. The bytes carry their own length and checksum (the core's
snapshot format); a file that fails them is refused, and `on_bad_snapshot`
says whether the router then starts with an empty index or exits.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from kvrouter._core import PrefixIndex
from kvrouter.net.startup import StartupError

log = logging.getLogger("kvrouter.service.snapshot_file")


def check_writable(path: Path) -> None:
    """Refuses, at start-up, a snapshot path the shutdown could not write."""
    folder = path.parent
    if not folder.is_dir():
        raise StartupError(f"snapshot_path {path}: directory {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise StartupError(f"snapshot_path {path}: directory {folder} is not writable")
    if path.is_dir():
        raise StartupError(f"snapshot_path {path} is a directory")


def write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # makes the rename itself durable
    finally:
        os.close(folder)


def save(path: Path, data: bytes) -> bool:
    """Writes a snapshot; a failure is logged rather than raised, so that a
    full disk or a vanished directory never keeps a router from stopping."""
    try:
        write_atomically(path, data)
    except OSError as e:
        log.error(
            "index snapshot not written", extra={"fields": {"path": str(path), "error": str(e)}}
        )
        return False
    return True


def load(path: Path, on_bad: str) -> tuple[PrefixIndex, dict[str, int]] | None:
    """(index, the counters stored with it), or None when there is no
    snapshot, or a bad one and `on_bad` is "empty". A bad one is then moved
    aside to `<path>.corrupt`, kept for inspection rather than overwritten."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return PrefixIndex.restore_marked(data)
    except ValueError as e:
        if on_bad != "empty":
            raise StartupError(f"snapshot {path} refused: {e}") from None
        aside = path.with_name(path.name + ".corrupt")
        os.replace(path, aside)
        log.error(
            "snapshot refused; starting with an empty index",
            extra={"fields": {"path": str(path), "moved_to": str(aside), "error": str(e)}},
        )
        return None
