"""`kvrouter sidecar --nats URL --router A --router B`: vLLM engines in front
of two router replicas. The sidecar registers each engine with both
replicas and publishes its events to the stream, so either replica routes
a prompt to the engine that holds it."""

from __future__ import annotations

import pytest

from kvrouter.adapters.vllm.sidecar import VllmSidecar
from kvrouter.proto_gen import router_pb2 as pb

from . import vllm_schema as vs
from .conftest import until
from .engine_hashes import EngineHasher, prompt
from .engine_http import EngineHttp

pytest.importorskip("nats", reason="the adapters extra (nats-py) is not installed")

from kvrouter.adapters.nats import NatsConfig  # noqa: E402

from .test_replica_service import CALL_S, replicas, run  # noqa: E402


def test_the_sidecar_joins_both_replicas_and_either_routes_by_its_events(farm, nats_url):
    hasher = EngineHasher(as_bytes=True)
    on_a, on_b = prompt(1, 8), prompt(2, 8)

    async def scenario():
        http_a, http_b = await EngineHttp().start(), await EngineHttp().start()
        a, (pub_a,) = farm.start("a", "map", address=http_a.url)
        b, (pub_b,) = farm.start("b", "positional", address=http_b.url)
        engines = {a.worker_ids[0]: http_a.url, b.worker_ids[0]: http_b.url}
        async with replicas(nats_url, "router-a", "router-b") as (r1, r2):
            targets = [f"127.0.0.1:{r.server.server.port}" for r in (r1, r2)]
            async with VllmSidecar(targets, [a, b], nats=NatsConfig(servers=(nats_url,))):
                for replica in (r1, r2):
                    listing = await replica.registry.List(pb.ListWorkersRequest(), timeout=CALL_S)
                    assert {w.worker_id: w.address for w in listing.workers} == engines
                pub_a.publish([vs.stored("map", hasher.hashes(on_a), on_a)])
                pub_b.publish([vs.stored("positional", hasher.hashes(on_b), on_b)])
                for replica in (r1, r2):
                    for engine, tokens in ((a, on_a), (b, on_b)):
                        await until(
                            lambda r=replica, e=engine, t=tokens: (
                                r.server.replica.index.find_matches_for_tokens(t).scores
                                == {e.worker_ids[0]: 8}
                            ),
                            f"engine {engine.name}'s blocks in replica {replica.name}",
                        )
                for turn, (replica, other) in enumerate(((r1, r2), (r2, r1))):
                    for engine, tokens in ((a, on_a), (b, on_b)):
                        # Each answered, and known answered by the other
                        # replica, before the next: the holder is not busy.
                        chosen = await replica.route(f"{engine.name}-{turn}", tokens + [turn])
                        await replica.finished_as_seen_by(other, f"{engine.name}-{turn}")
                        assert (chosen.decode_worker, chosen.decode_address) == (
                            engine.worker_ids[0],
                            engine.address,
                        )
            # The sidecar left both replicas as it stopped.
            for replica in (r1, r2):
                listing = await replica.registry.List(pb.ListWorkersRequest(), timeout=CALL_S)
                assert list(listing.workers) == []
        for http in (http_a, http_b):
            await http.stop()

    run(scenario())


def test_several_routers_without_nats_are_refused(farm):
    a, _ = farm.start("a", "map")
    with pytest.raises(ValueError, match="replicas"):
        VllmSidecar(["127.0.0.1:1", "127.0.0.1:2"], [a])
