"""Tensor parallelism on CPU: two gloo ranks produce what one process does."""

import torch
import torch.multiprocessing as mp

from kvrouter.engine import LLMEngine

from .tensor_parallel_worker import engine_config, run_engine, run_rank


def test_tp2_equals_tp1(tiny_qwen2, tmp_path):
    expected = run_engine(LLMEngine(engine_config(tiny_qwen2, 0, 1)))

    mp.spawn(
        run_rank,
        args=(2, str(tiny_qwen2), str(tmp_path / "rendezvous"), str(tmp_path)),
        nprocs=2,
        join=True,
    )

    for rank in (0, 1):
        actual = torch.load(tmp_path / f"rank{rank}.pt")
        # Each rank holds half of the KV heads, hence half of the KV cache.
        assert actual["local_kv_heads"] == expected["local_kv_heads"] // 2
        assert actual["tokens"] == expected["tokens"]
        # Partial sums are added in another order: equal up to fp32 rounding.
        torch.testing.assert_close(actual["logits"], expected["logits"], atol=1e-5, rtol=1e-5)
