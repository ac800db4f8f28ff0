"""The deadline a connection moves on every request (net/lazy_timer.py),
on a loop whose clock the test moves: it expires once, by the last deadline
armed and at most a clock tick before it, never while disarmed, and re-arms
the loop's timer only when it must."""

from __future__ import annotations

import heapq

from hypothesis import example, given
from hypothesis import strategies as st

from kvrouter.net.lazy_timer import CLOCK_TICK_S, LazyTimer


class _Handle:
    def __init__(self, when: float, callback) -> None:
        self._when = when
        self.callback = callback
        self.cancelled = False

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self.cancelled = True

    def __lt__(self, other: _Handle) -> bool:
        return self._when < other._when


class FakeLoop:
    """The loop's clock and timers, advanced by the test."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[_Handle] = []
        self.armed = 0

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback) -> _Handle:
        handle = _Handle(when, callback)
        heapq.heappush(self.timers, handle)
        self.armed += 1
        return handle

    def advance(self, seconds: float) -> None:
        until = self.now + seconds
        while self.timers and self.timers[0].when() <= until:
            handle = heapq.heappop(self.timers)
            if not handle.cancelled:
                self.now = max(self.now, handle.when())
                handle.callback()
        self.now = until


def timer() -> tuple[FakeLoop, LazyTimer, list[float]]:
    loop = FakeLoop()
    fired: list[float] = []
    return loop, LazyTimer(loop, lambda: fired.append(loop.now)), fired


def test_a_deadline_moved_on_every_request_arms_the_loop_once_per_its_length():
    loop, lazy, fired = timer()
    for _ in range(1000):  # a request every 10 ms, each moving the 5 s deadline
        lazy.arm(5.0)
        loop.advance(0.01)
    assert loop.armed <= 4
    # The last request came at 9.99 s: its deadline is 14.99 s.
    loop.advance(4.98)
    assert fired == []
    loop.advance(0.02)
    assert len(fired) == 1 and abs(fired[0] - 14.99) < 1e-6


def test_a_deadline_moved_earlier_fires_then_and_a_disarmed_one_never():
    loop, lazy, fired = timer()
    lazy.arm(30.0)
    lazy.arm(0.5)
    loop.advance(1.0)
    assert fired == [0.5]
    lazy.arm(1.0)
    lazy.disarm()
    loop.advance(10.0)
    assert fired == [0.5]


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("arm"), st.floats(0.0, 10.0)),
            st.tuples(st.just("disarm"), st.just(0.0)),
            st.tuples(st.just("advance"), st.floats(0.0, 10.0)),
        ),
        max_size=60,
    )
)
# A deadline moved a tick later than a timer already pending: that timer's
# firing is within a tick of the deadline, and may expire it.
@example([("arm", 0.0), ("arm", 0.001), ("advance", 0.0)])
def test_it_fires_once_by_the_last_armed_deadline(steps):
    """It expires at most once per arm, never while disarmed, never more
    than a clock tick before the deadline (libuv's timers fire up to a tick
    early, so it accepts a timer that does), and always by the deadline."""
    loop, lazy, fired = timer()
    due: float | None = None
    for op, value in steps:
        if op == "arm":
            lazy.arm(value)
            due = loop.now + value
        elif op == "disarm":
            lazy.disarm()
            due = None
        else:
            before = len(fired)
            until = loop.now + value
            loop.advance(value)
            if len(fired) > before:
                assert len(fired) == before + 1 and due is not None
                assert due - CLOCK_TICK_S <= fired[-1] <= due + 1e-9
                due = None
            else:
                assert due is None or due > until
