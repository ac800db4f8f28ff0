"""Worker ids across router replicas on a real nats-server: workers joining
at either replica get ids no other worker has, and a replica restarted from
its snapshot never hands out an id again; with NATS down, a replica refuses
to assign one until NATS is back."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from kvrouter.client.worker import WorkerRegistration
from kvrouter.proto_gen import router_pb2 as pb

from .nats_server import NatsServer
from .test_replica_service import BLOCK, CALL_S, replicas, run

pytest.importorskip("nats", reason="the adapters extra (nats-py) is not installed")


def target(replica) -> str:
    return f"127.0.0.1:{replica.server.server.port}"


def registration(replica, address: str, worker_id: int | None = None) -> WorkerRegistration:
    return WorkerRegistration(
        target(replica),
        role="both",
        capacity_blocks=1_000,
        address=address,
        block_size=BLOCK,
        worker_id=worker_id,
    )


async def listed(replica) -> dict[int, str]:
    listing = await replica.registry.List(pb.ListWorkersRequest(), timeout=CALL_S)
    return {w.worker_id: w.address for w in listing.workers}


async def still_registered(replica, reg: WorkerRegistration) -> None:
    """A heartbeat with the registration's token: refused if another process
    registered the id since."""
    await replica.registry.Heartbeat(
        pb.HeartbeatRequest(worker_id=reg.worker_id, registration_token=reg.registration_token),
        timeout=CALL_S,
    )


async def new_ids(replica, count: int) -> list[int]:
    """Registers `count` workers without ids and deregisters them."""
    regs = [registration(replica, f"gone{i}:1") for i in range(count)]
    ids = [(await reg.start()).worker_id for reg in regs]
    for reg in regs:
        await reg.stop()
    return ids


def test_workers_joining_at_either_replica_get_distinct_ids_and_keep_them(nats_url):
    async def scenario():
        async with replicas(nats_url, "router-a", "router-b") as (a, b):
            # One worker picked its id itself, where the counters start.
            pinned = [registration(r, "pinned:1", worker_id=2) for r in (a, b)]
            for reg in pinned:
                await reg.start()
            firsts = {f"w{i}:1": a if i % 2 else b for i in range(12)}
            first_regs = {addr: registration(r, addr) for addr, r in firsts.items()}
            # Every worker registers with its first replica at once, then
            # joins the other under the id it was given.
            await asyncio.gather(*(reg.start() for reg in first_regs.values()))
            joins = {
                addr: registration(b if r is a else a, addr, reg.worker_id)
                for (addr, r), reg in zip(firsts.items(), first_regs.values(), strict=True)
            }
            await asyncio.gather(*(reg.start() for reg in joins.values()))
            try:
                ids = {addr: reg.worker_id for addr, reg in first_regs.items()}
                assert len(set(ids.values())) == len(ids) and 2 not in ids.values()
                expected = {worker_id: addr for addr, worker_id in ids.items()} | {2: "pinned:1"}
                for replica in (a, b):
                    assert await listed(replica) == expected
                for addr, replica in firsts.items():
                    other = b if replica is a else a
                    await still_registered(replica, first_regs[addr])
                    await still_registered(other, joins[addr])
            finally:
                for reg in [*pinned, *first_regs.values(), *joins.values()]:
                    await reg.stop()

    run(scenario())


def test_a_replica_restarted_from_its_snapshot_never_hands_out_an_id_again(nats_url, tmp_path):
    snapshot = str(tmp_path / "a.snapshot")

    async def scenario():
        async with replicas(nats_url, "router-a", snapshot_path=snapshot) as (a,):
            before = await new_ids(a, 3)
        async with replicas(nats_url, "router-b") as (b,):
            before += await new_ids(b, 3)
        async with replicas(nats_url, "router-a", snapshot_path=snapshot) as (a,):
            after = await new_ids(a, 3)
        assert len(set(before + after)) == 9

    run(scenario())


def test_a_replica_restarted_from_its_snapshot_on_a_new_nats_never_hands_out_an_id_again(
    tmp_path,
):
    """The snapshot keeps the ids the replica reserved, should the bucket
    that shares them be lost with the NATS server's store."""
    snapshot = str(tmp_path / "a.snapshot")

    async def assigned(store: str) -> list[int]:
        server = NatsServer(tmp_path / store)
        try:
            async with replicas(server.url, "router-a", snapshot_path=snapshot) as (a,):
                return await new_ids(a, 3)
        finally:
            server.stop()

    async def scenario():
        before = await assigned("first-store")
        after = await assigned("second-store")
        assert len(set(before + after)) == 6

    run(scenario())


def test_an_id_wanted_while_nats_is_down_is_refused_as_unavailable_and_retried(tmp_path):
    store = tmp_path / "jetstream"

    async def scenario():
        server = NatsServer(store)
        try:
            async with replicas(server.url, "router-a") as (a,):
                server.stop()
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await a.registry.Register(
                        pb.RegisterRequest(
                            role=pb.ROLE_BOTH,
                            address="w:1",
                            block_size=BLOCK,
                            capacity_blocks=1_000,
                        ),
                        timeout=CALL_S,
                    )
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "through NATS, which did not answer" in refused.value.details()
                # A worker waits for the router as it would for one not up yet.
                reg = registration(a, "w:1")
                joining = asyncio.create_task(reg.start(wait_for_router=True))
                server = NatsServer(store, server.port)
                assert (await joining).worker_id == 1
                assert await listed(a) == {1: "w:1"}
                await reg.stop()
        finally:
            server.stop()

    run(scenario())
