"""The deadline a connection moves on every request (net/lazy_timer.py),
on a loop whose clock the test moves: it expires once, at the last deadline
armed, never while disarmed, and re-arms the loop's timer only when it must."""

from __future__ import annotations

import heapq

from hypothesis import given
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
def test_it_fires_once_at_the_last_armed_deadline(steps):
    loop, lazy, fired = timer()
    due: float | None = None
    expected: list[float] = []
    for op, value in steps:
        if op == "arm":
            lazy.arm(value)
            due = loop.now + value
        elif op == "disarm":
            lazy.disarm()
            due = None
        else:
            until = loop.now + value
            loop.advance(value)
            if due is not None and due <= until:
                expected.append(due)
                due = None
    assert len(fired) == len(expected)
    for got, want in zip(fired, expected, strict=True):
        assert want - CLOCK_TICK_S <= got <= want + 1e-9
