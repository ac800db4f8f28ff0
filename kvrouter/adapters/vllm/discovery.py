"""Makes the configured engines' workers known to the routing policy."""

from __future__ import annotations

from kvrouter.adapters.vllm.config import DEFAULT_CAPACITY_BLOCKS, EngineConfig


def register_engines(router, engines: list[EngineConfig]) -> list[int]:
    """Upserts one worker per DP rank into a `kvrouter.policy.Router`;
    returns their ids. An entry without `capacity_blocks` gets
    `DEFAULT_CAPACITY_BLOCKS`: there is no engine page to read it from."""
    ids = []
    for engine in engines:
        for worker_id in engine.worker_ids:
            router.upsert_worker(
                worker_id,
                engine.role,
                engine.capacity_blocks or DEFAULT_CAPACITY_BLOCKS,
                model=engine.model,
                adapters=list(engine.adapters),
            )
            ids.append(worker_id)
    return ids
