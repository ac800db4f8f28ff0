"""A one-line progress bar on stderr: redrawn in place on a terminal,
printed once when done otherwise (logs stay readable)."""

from __future__ import annotations

import sys


class ProgressBar:
    def __init__(self, total: int, label: str, width: int = 30) -> None:
        self.total = total
        self.label = label
        self.width = width
        self.done = 0
        self._tty = sys.stderr.isatty()
        if self._tty:
            self._draw()

    def advance(self) -> None:
        self.done += 1
        if self._tty or self.done == self.total:
            self._draw()

    def _draw(self) -> None:
        filled = self.width * self.done // max(self.total, 1)
        bar = "#" * filled + "." * (self.width - filled)
        end = "\n" if self.done == self.total else ""
        start = "\r" if self._tty else ""
        sys.stderr.write(f"{start}  {self.label:<12} [{bar}] {self.done}/{self.total}{end}")
        sys.stderr.flush()
