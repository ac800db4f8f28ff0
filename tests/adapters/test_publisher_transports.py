"""One `EventPublisher`, one contract over both transports: the router's
gRPC event stream and the JetStream stream that router replicas read."""

from __future__ import annotations

import contextlib

import pytest

from kvrouter.client import WorkerRegistration
from kvrouter.client.event_stream import GrpcEventTransport
from kvrouter.events import EventPublisher, Tier
from kvrouter.service import RouterServer, ServiceConfig

from .conftest import until
from .engine_hashes import BS, prompt
from .test_vllm_events import run

nats = pytest.importorskip("nats", reason="the adapters extra (nats-py) is not installed")

from kvrouter.adapters.nats import IndexReplica, NatsConfig  # noqa: E402
from kvrouter.adapters.nats.transport import JetStreamTransport  # noqa: E402

WORKER = 7
TRANSPORTS = ["grpc", "jetstream"]


@contextlib.asynccontextmanager
async def router_stream():
    """A router, with the worker registered: its transport and its index."""
    server = RouterServer(
        ServiceConfig(
            listen="127.0.0.1:0", metrics_listen="", log_format="text", log_decisions=False
        )
    )
    await server.start()
    target = f"127.0.0.1:{server.port}"
    registration = WorkerRegistration(target, role="both", capacity_blocks=10_000, worker_id=WORKER)
    await registration.start()
    try:
        yield GrpcEventTransport(target), server.index
    finally:
        await registration.stop(deregister=False)
        await server.stop(grace=0)


@contextlib.asynccontextmanager
async def replica_stream(nats_url):
    """A replica reading the stream: the stream's transport and the replica's index."""
    nc = await nats.connect(servers=[nats_url])
    config = NatsConfig(servers=(nats_url,))
    replica = IndexReplica(nc, config, "r1")
    await replica.start()
    try:
        yield JetStreamTransport(nc.jetstream(), config), replica.index
    finally:
        await replica.stop(snapshot=False)
        await nc.close()


def receiver(kind: str, request):
    if kind == "grpc":
        return router_stream()
    return replica_stream(request.getfixturevalue("nats_url"))


def blocks_of(index, tokens) -> dict[int, int]:
    return index.find_matches_for_tokens(tokens).scores


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_events_arrive_and_a_restarted_publisher_replaces_its_entries(kind, request):
    first, second = prompt(1, 4), prompt(2, 2)

    async def scenario():
        async with receiver(kind, request) as (transport, index):
            for run_of_worker, tokens in enumerate((first, second)):
                publisher = EventPublisher(transport, WORKER, block_size=BS)
                await publisher.start()
                ids = [100 * (run_of_worker + 1) + b for b in range(len(tokens) // BS)]
                publisher.stored(None, ids[:1], tokens[:BS])
                publisher.stored(ids[0], ids[1:], tokens[BS:], Tier.HOST)
                assert await publisher.flush(timeout=10)
                await publisher.stop()
                await until(
                    lambda t=tokens: blocks_of(index, t) == {WORKER: len(t) // BS},
                    f"run {run_of_worker}'s blocks",
                )
                tiers = index.find_matches_for_tokens(tokens).tiers[WORKER]
                assert tiers == (1, len(tokens) // BS - 1, 0)
            # The second run's first batch was a resync: the first run's blocks are gone.
            assert blocks_of(index, first) == {}

    run(scenario())


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_publisher_that_dropped_events_sends_its_dump(kind, request):
    cache: dict[int, list[int]] = {}  # the engine's cache: block id -> tokens

    def dump_cache(sink) -> None:
        for block_id, tokens in sorted(cache.items()):
            sink.stored(None, [block_id], tokens)

    async def scenario():
        async with receiver(kind, request) as (transport, index):
            publisher = EventPublisher(
                transport, WORKER, block_size=BS, dump_cache=dump_cache, max_pending_events=4
            )
            # Before it starts, an engine that stores and evicts keeps its last 3 blocks.
            for block_id in range(20):
                cache[block_id] = prompt(10 + block_id, 1)
                publisher.stored(None, [block_id], cache[block_id])
                if len(cache) > 3:
                    evicted = min(cache)
                    del cache[evicted]
                    publisher.removed([evicted])
            assert publisher.overflows > 0 and publisher.pending_events <= 4
            await publisher.start()
            assert await publisher.flush(timeout=10)
            await publisher.stop()
            assert publisher.dumps_sent == 1
            await until(lambda: index.workers().get(WORKER, (0, 0))[0] == 3, "the dump")
            for tokens in cache.values():
                assert blocks_of(index, tokens) == {WORKER: 1}

    run(scenario())
