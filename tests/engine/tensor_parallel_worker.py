"""One rank of a CPU tensor-parallel engine run, started by test_tensor_parallel."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from kvrouter.engine import EngineConfig, LLMEngine, SamplingParams
from kvrouter.engine.parallel import init_tensor_parallel

PROMPTS = [[3, 17, 250, 9, 41, 41, 8, 120, 77, 5, 64], [200, 1, 9, 30]]
PARAMS = [
    SamplingParams(max_tokens=8, ignore_eos=True),
    SamplingParams(max_tokens=8, temperature=1.0, top_p=0.8, seed=5, ignore_eos=True),
]


def run_engine(engine: LLMEngine) -> dict:
    completions = engine.generate(PROMPTS, PARAMS)
    return {
        "tokens": [completion.token_ids for completion in completions],
        "logits": engine.prompt_logits(PROMPTS[0]),
        "local_kv_heads": engine.kv_layout.num_kv_heads,
    }


def engine_config(checkpoint: Path, rank: int, size: int) -> EngineConfig:
    return EngineConfig(
        model=checkpoint, block_size=4, num_kv_blocks=32, tp_rank=rank, tp_size=size
    )


def run_rank(rank: int, size: int, checkpoint: str, rendezvous: str, results: str) -> None:
    torch.set_num_threads(1)
    tp = init_tensor_parallel(rank, size, torch.device("cpu"), init_method=f"file://{rendezvous}")
    try:
        result = run_engine(LLMEngine(engine_config(Path(checkpoint), rank, size), tp=tp))
        torch.save(result, Path(results) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
