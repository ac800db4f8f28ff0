"""Expiry only for silence the router could observe.

The expiry loop wakes every `period_s`. A wake-up far later than asked means
the router itself was not running (SIGSTOP, a paused VM, swapping, a loop
blocked by a long call): the heartbeats workers sent meanwhile wait unread in
its sockets, and judging workers by the last heartbeat read would expire
every one of them at once. After such a stall expiry is held for `grace_s`
(a heartbeat TTL), so every live worker gets its heartbeats through first.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("kvrouter.service.stalls")


class StallGuard:
    """Call `may_expire(now)` at each wake-up of the expiry loop."""

    def __init__(self, period_s: float, grace_s: float) -> None:
        self.period_s = period_s
        self.grace_s = grace_s
        self._last_wake = time.monotonic()
        self._held_until = 0.0

    def may_expire(self, now: float) -> bool:
        """False while expiry is held after a stall longer than a period."""
        stalled_s = now - self._last_wake - self.period_s
        self._last_wake = now
        if stalled_s > self.period_s:
            self._held_until = now + self.grace_s
            log.warning(
                "router stalled; expiry held",
                extra={"fields": {"stalled_s": round(stalled_s, 3), "grace_s": self.grace_s}},
            )
        return now >= self._held_until
