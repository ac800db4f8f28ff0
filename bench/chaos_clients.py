"""The clients of bench/chaos_soak.py, running until told to stop: proxied
`Generate` through the router, and a gateway's `RouteStream` with a
lifecycle report (`finished` or `cancelled`) for each decision.

Every call has a deadline. A call that has not returned within its deadline
plus `SLACK_S` is counted as hung and abandoned; every other outcome is
counted by what the router answered.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections import Counter

import grpc

from kvrouter.client import AsyncRouterClient, RouterError
from kvrouter.client.generate import GenerateClient
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

SLACK_S = 5.0
GENERATE_DEADLINE_S = 30.0
# One gateway stream carries this many decisions, then the next one opens.
STREAM_REQUESTS = 20
STREAM_DEADLINE_S = 60.0
REPORT_DEADLINE_S = 5.0
# Prompts share one of a few prefixes, so the index has overlaps to find.
PREFIXES = 8
VOCAB = 256
CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


class Hung(Exception):
    pass


class Tally:
    """What the clients saw, by kind of call and outcome, and for errors the
    router's messages (numbers masked, so that alike messages count as one)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.messages: dict[str, Counter[str]] = {}
        # (monotonic time, "call outcome") of every call that did not succeed.
        self.failures: list[tuple[float, str]] = []

    def count(self, call: str, outcome: str, message: str = "") -> None:
        self.calls[call] += 1
        self.outcomes[f"{call} {outcome}"] += 1
        if outcome not in ("ok", "failed over"):
            self.failures.append((time.monotonic(), f"{call} {outcome}"))
        if message:
            masked = re.sub(r"\d+", "N", message)[:100]
            self.messages.setdefault(f"{call} {outcome}", Counter())[masked] += 1

    @property
    def hung(self) -> int:
        return sum(n for key, n in self.outcomes.items() if key.endswith(" hung"))


async def within(awaitable, deadline_s: float):
    """The awaitable's result, or Hung past its deadline and the slack."""
    try:
        return await asyncio.wait_for(awaitable, deadline_s + SLACK_S)
    except TimeoutError:
        raise Hung from None


def prompt(rng: random.Random) -> list[int]:
    """A shared prefix of 2-6 blocks and a fresh tail of 1-5 blocks."""
    prefix = random.Random(rng.randrange(PREFIXES))
    head = [prefix.randrange(3, VOCAB) for _ in range(16 * prefix.randint(2, 6))]
    return head + [rng.randrange(3, VOCAB) for _ in range(16 * rng.randint(1, 5))]


async def generate_loop(target: str, seed: int, tally: Tally, stop: asyncio.Event) -> None:
    rng = random.Random(seed)
    async with GenerateClient(target, timeout=GENERATE_DEADLINE_S) as client:
        while not stop.is_set():
            tokens = prompt(rng)
            call = client.generate(tokens, max_tokens=rng.randint(2, 8), ignore_eos=True)
            try:
                result = await within(call, GENERATE_DEADLINE_S)
            except Hung:
                tally.count("generate", "hung")
                continue
            except RouterError as e:
                tally.count("generate", e.code.name, e.message)
                await asyncio.sleep(0.2)  # as a client backs off
                continue
            tally.count("generate", "failed over" if result.stats.retries else "ok")


class Gateway:
    """Decisions over one RouteStream at a time; each request is then
    "served" for a moment and reported finished, or cancelled."""

    def __init__(self, target: str, seed: int, tally: Tally) -> None:
        self.channel = grpc.aio.insecure_channel(target)
        self.router = router_pb2_grpc.RouterStub(self.channel)
        self.reports = AsyncRouterClient(target, channel=self.channel, timeout=REPORT_DEADLINE_S)
        self.rng = random.Random(seed)
        self.tally = tally

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                await self.stream(stop)
        finally:
            await self.channel.close()

    async def stream(self, stop: asyncio.Event) -> None:
        call = self.router.RouteStream(timeout=STREAM_DEADLINE_S)
        opened = time.monotonic()
        try:
            for _ in range(STREAM_REQUESTS):
                if stop.is_set():
                    break
                tokens = prompt(self.rng)
                await call.write(pb.RouteRequest(tokens=tokens))
                left = STREAM_DEADLINE_S - (time.monotonic() - opened)
                response = await within(call.read(), left)
                if response is grpc.aio.EOF:
                    self.tally.count("route", "stream ended")
                    return
                if response.HasField("error"):
                    code = CODE_NAMES.get(response.error.code, str(response.error.code))
                    self.tally.count("route", code, response.error.message)
                    await asyncio.sleep(0.2)
                    continue
                self.tally.count("route", "ok")
                await self.serve(response.request_id)
            await call.done_writing()
        except Hung:
            self.tally.count("route", "hung")
        except grpc.RpcError as e:
            self.tally.count("route", e.code().name, e.details() or "")
            await asyncio.sleep(0.2)
        except asyncio.InvalidStateError:  # a write after the router ended the call
            self.tally.count("route", (await call.code()).name, await call.details())
            await asyncio.sleep(0.2)
        finally:
            call.cancel()

    async def serve(self, request_id: str) -> None:
        cancelled = self.rng.random() < 0.15
        await asyncio.sleep(self.rng.uniform(0.02, 0.1 if cancelled else 0.4))
        report = self.reports.cancelled if cancelled else self.reports.finished
        name = "cancelled" if cancelled else "finished"
        try:
            await within(report(request_id), REPORT_DEADLINE_S)
        except Hung:
            self.tally.count(name, "hung")
        except RouterError as e:
            self.tally.count(name, e.code.name, e.message)
        else:
            self.tally.count(name, "ok")
