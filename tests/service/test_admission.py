"""The front door's admission queue on its own, with the backlog a test
sets: a model is held back while every worker's queued prefill is past the
bound, waiters go strictly by class and in arrival order, and one that
leaves the queue takes nothing with it."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("starlette", reason="the frontend extra is not installed")

from kvrouter.policy import UnknownModel  # noqa: E402
from kvrouter.service.openai.admission import Admission, Priority  # noqa: E402
from kvrouter.service.openai.errors import HttpError  # noqa: E402

BOUND_MS = 100.0


class Backlogs(dict):
    """model -> backlog ms; a missing model is unknown."""

    def __call__(self, model: str) -> float | None:
        if model not in self:
            raise UnknownModel(model)
        return self[model]


def admission(backlogs: Backlogs, **kwargs) -> Admission:
    settings = {"max_in_flight": 100, "max_queued": 10, "queue_timeout_s": 30.0, **kwargs}
    return Admission(backlogs, max_backlog_ms=BOUND_MS, **settings)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_a_model_past_the_backlog_waits_until_a_worker_has_room():
    async def scenario():
        backlogs = Backlogs(a=BOUND_MS + 1, b=0.0)
        gate = admission(backlogs)
        waiting = asyncio.ensure_future(gate.admit("a", Priority.NORMAL))
        assert await gate.admit("b", Priority.NORMAL) == 0.0, "another model is not held"
        await settle()
        assert not waiting.done() and gate.queued == 1
        backlogs["a"] = BOUND_MS
        assert await waiting >= 0.0
        assert gate.queued == 0 and gate.in_flight == 2
        await gate.close()

    run(scenario())


def test_no_healthy_worker_and_an_unknown_model_pass_to_routing():
    async def scenario():
        gate = admission(Backlogs(a=None))
        assert await gate.admit("a", Priority.NORMAL) == 0.0
        assert await gate.admit("nope", Priority.NORMAL) == 0.0

    run(scenario())


def test_waiters_go_strictly_by_class_then_in_arrival_order():
    async def scenario():
        gate = admission(Backlogs(a=0.0), max_in_flight=1)
        await gate.admit("a", Priority.NORMAL)
        order = []

        async def waiter(name, priority):
            await gate.admit("a", priority)
            order.append(name)

        tasks = []
        for name, priority in [
            ("n1", Priority.NORMAL),
            ("h1", Priority.HIGH),
            ("n2", Priority.NORMAL),
            ("h2", Priority.HIGH),
        ]:
            tasks.append(asyncio.ensure_future(waiter(name, priority)))
            await settle()
        for _ in tasks:
            gate.release()
            await settle()
        await asyncio.gather(*tasks)
        assert order == ["h1", "h2", "n1", "n2"]
        await gate.close()

    run(scenario())


def test_a_newcomer_queues_behind_its_class_even_when_a_place_is_free():
    async def scenario():
        backlogs = Backlogs(a=BOUND_MS + 1)
        gate = admission(backlogs)
        first = asyncio.ensure_future(gate.admit("a", Priority.NORMAL))
        await settle()
        backlogs["a"] = 0.0
        second = asyncio.ensure_future(gate.admit("a", Priority.NORMAL))
        done, _ = await asyncio.wait([first, second], return_when=asyncio.FIRST_COMPLETED)
        assert first in done
        await asyncio.gather(first, second)
        await gate.close()

    run(scenario())


def test_a_full_queue_is_429_and_a_long_wait_503():
    async def scenario():
        gate = admission(Backlogs(a=BOUND_MS + 1), max_queued=1, queue_timeout_s=0.05)
        waiting = asyncio.ensure_future(gate.admit("a", Priority.NORMAL))
        await settle()
        with pytest.raises(HttpError) as full:
            await gate.admit("a", Priority.HIGH)
        assert full.value.status == 429
        with pytest.raises(HttpError) as late:
            await waiting
        assert late.value.status == 503
        assert gate.queued == 0 and gate.in_flight == 0
        await gate.close()

    run(scenario())


def test_a_waiter_that_leaves_lets_the_next_class_in():
    async def scenario():
        gate = admission(Backlogs(a=0.0), max_in_flight=1)
        await gate.admit("a", Priority.NORMAL)
        high = asyncio.ensure_future(gate.admit("a", Priority.HIGH))
        normal = asyncio.ensure_future(gate.admit("a", Priority.NORMAL))
        await settle()
        high.cancel()
        await settle()
        assert gate.queued == 1
        gate.release()
        await normal
        assert gate.in_flight == 1 and gate.queued == 0
        await gate.close()

    run(scenario())
