"""vLLM engines behind the real kvrouter service, through the sidecar."""

from __future__ import annotations

from kvrouter.adapters.vllm.sidecar import VllmSidecar
from kvrouter.client import AsyncRouterClient
from kvrouter.service import RouterServer, ServiceConfig

from . import vllm_schema as vs
from .conftest import until
from .engine_hashes import EngineHasher, prompt
from .engine_http import EngineHttp
from .test_vllm_events import run


def test_the_router_service_routes_by_the_engines_events(farm):
    hasher = EngineHasher(as_bytes=True)
    on_a, on_b = prompt(1, 8), prompt(2, 8)

    async def scenario():
        http_a, http_b = await EngineHttp().start(), await EngineHttp().start()
        a, (pub_a,) = farm.start("a", "map", address=http_a.url)
        b, (pub_b,) = farm.start("b", "positional", address=http_b.url)
        server = RouterServer(
            ServiceConfig(
                listen="127.0.0.1:0", metrics_listen="", log_format="text", log_decisions=False
            )
        )
        await server.start()
        target = f"127.0.0.1:{server.port}"
        try:
            async with VllmSidecar(target, [a, b]), AsyncRouterClient(target) as client:
                pub_a.publish([vs.stored("map", hasher.hashes(on_a), on_a)])
                pub_b.publish([vs.stored("positional", hasher.hashes(on_b), on_b)])
                for engine, tokens in ((a, on_a), (b, on_b)):
                    await until(
                        lambda e=engine, t=tokens: (
                            server.index.find_matches_for_tokens(t).scores == {e.worker_ids[0]: 8}
                        ),
                        f"engine {engine.name}'s blocks",
                    )
                for turn in range(3):
                    chosen = await client.route(on_a + [turn])
                    assert (chosen.decode_worker, chosen.decode_address) == (
                        a.worker_ids[0],
                        http_a.url,
                    )
                    chosen = await client.route(on_b + [turn])
                    assert chosen.decode_worker == b.worker_ids[0]
        finally:
            await server.stop(grace=0)
            for http in (http_a, http_b):
                await http.stop()

    run(scenario())
