"""Makes the configured engines' workers known to the routing policy."""

from __future__ import annotations

from kvrouter.adapters.vllm.config import EngineConfig


def register_engines(router, engines: list[EngineConfig]) -> list[int]:
    """Upserts one worker per DP rank into a `kvrouter.policy.Router`;
    returns their ids."""
    ids = []
    for engine in engines:
        for worker_id in engine.worker_ids:
            router.upsert_worker(
                worker_id,
                engine.role,
                engine.capacity_blocks,
                model=engine.model,
                adapters=list(engine.adapters),
            )
            ids.append(worker_id)
    return ids
