"""GPU kernel benchmark: `python -m kvrouter.engine.kernel_benchmark [--out results.json]`.

Prints one table per kernel and writes the numbers as JSON. Every figure is
set against a ceiling or a peer measured in the same run:
- paged decode attention: bytes of KV read per second, against the
  device-to-device copy bandwidth and against torch SDPA on contiguous KV;
- prefill attention: causal TFLOP/s, against torch SDPA (flash) on contiguous tensors;
- all-reduce (under torchrun with 2+ GPUs): latency of the symmetric-memory
  one-shot path against NCCL.

Needs CUDA; on a CPU-only machine it exits with a message.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 16
DECODE_SHAPES = [(64, 4096), (1, 32768), (16, 8192), (256, 1024)]
PREFILL_SHAPES = [(1, 4096), (4, 2048), (16, 512)]
ALL_REDUCE_BYTES = [8 * 1024, 64 * 1024, 256 * 1024, 4 * 1024 * 1024]


def time_ms(fn, iterations: int = 50) -> float:
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iterations):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iterations


def copy_bandwidth_tbs() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), 20)
    return 2 * src.numel() / (ms * 1e-3) / 1e12


def paged_cache(num_seqs: int, context_len: int, dtype: torch.dtype):
    pages_per_seq = -(-context_len // PAGE_SIZE)
    num_pages = num_seqs * pages_per_seq
    shape = (num_pages, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, dtype=dtype, device="cuda")
    v_cache = torch.randn(shape, dtype=dtype, device="cuda")
    # Shuffled pages, as a long-running cache would hold them.
    block_tables = torch.randperm(num_pages, device="cuda", dtype=torch.int32)
    block_tables = block_tables.view(num_seqs, pages_per_seq)
    return k_cache, v_cache, block_tables


def decode_row(batch: int, context_len: int, dtype: torch.dtype, copy_tbs: float) -> dict:
    from kvrouter.engine.kernels.triton_decode import paged_decode_attention_triton

    k_cache, v_cache, block_tables = paged_cache(batch, context_len, dtype)
    context_lens = torch.full((batch,), context_len, dtype=torch.int32, device="cuda")
    query = torch.randn(batch, NUM_HEADS, HEAD_DIM, dtype=dtype, device="cuda")
    scale = HEAD_DIM**-0.5
    kv_bytes = 2 * batch * context_len * NUM_KV_HEADS * HEAD_DIM * k_cache.element_size()
    paged_ms = time_ms(
        lambda: paged_decode_attention_triton(
            query, k_cache, v_cache, block_tables, context_lens, scale, context_len
        )
    )
    key = torch.randn(batch, NUM_KV_HEADS, context_len, HEAD_DIM, dtype=dtype, device="cuda")
    value = torch.randn_like(key)
    sdpa_query = query.unsqueeze(2)
    sdpa_ms = time_ms(
        lambda: F.scaled_dot_product_attention(sdpa_query, key, value, scale=scale, enable_gqa=True)
    )
    paged_tbs = kv_bytes / (paged_ms * 1e-3) / 1e12
    return {
        "batch": batch,
        "context": context_len,
        "paged_tbs": paged_tbs,
        "sdpa_contiguous_tbs": kv_bytes / (sdpa_ms * 1e-3) / 1e12,
        "fraction_of_copy": paged_tbs / copy_tbs,
    }


def prefill_row(num_seqs: int, seq_len: int, dtype: torch.dtype) -> dict:
    from kvrouter.engine.kernels.triton_kv_write import write_kv_triton
    from kvrouter.engine.kernels.triton_prefill import paged_prefill_attention_triton

    k_cache, v_cache, block_tables = paged_cache(num_seqs, seq_len, dtype)
    tokens = num_seqs * seq_len
    query = torch.randn(tokens, NUM_HEADS, HEAD_DIM, dtype=dtype, device="cuda")
    key = torch.randn(tokens, NUM_KV_HEADS, HEAD_DIM, dtype=dtype, device="cuda")
    value = torch.randn_like(key)
    positions = torch.arange(seq_len, device="cuda")
    pages = block_tables.long()[:, positions // PAGE_SIZE]
    slots = (pages * PAGE_SIZE + positions % PAGE_SIZE).flatten()
    write_kv_triton(key, value, k_cache, v_cache, slots)
    cu_seqlens = torch.arange(0, tokens + 1, seq_len, dtype=torch.int32, device="cuda")
    context_lens = torch.full((num_seqs,), seq_len, dtype=torch.int32, device="cuda")
    scale = HEAD_DIM**-0.5
    flops = 4 * num_seqs * seq_len * seq_len * NUM_HEADS * HEAD_DIM / 2
    paged_ms = time_ms(
        lambda: paged_prefill_attention_triton(
            query, k_cache, v_cache, block_tables, cu_seqlens, context_lens, scale, seq_len
        )
    )
    dense_q = query.view(num_seqs, seq_len, NUM_HEADS, HEAD_DIM).transpose(1, 2)
    dense_k = key.view(num_seqs, seq_len, NUM_KV_HEADS, HEAD_DIM).transpose(1, 2)
    dense_v = value.view(num_seqs, seq_len, NUM_KV_HEADS, HEAD_DIM).transpose(1, 2)
    sdpa_ms = time_ms(
        lambda: F.scaled_dot_product_attention(
            dense_q, dense_k, dense_v, is_causal=True, scale=scale, enable_gqa=True
        )
    )
    return {
        "seqs": num_seqs,
        "seq_len": seq_len,
        "paged_tflops": flops / (paged_ms * 1e-3) / 1e12,
        "sdpa_tflops": flops / (sdpa_ms * 1e-3) / 1e12,
    }


def all_reduce_row(all_reduce, size: int) -> dict:
    import torch.distributed as dist

    x = torch.randn(size // 2, dtype=torch.bfloat16, device="cuda")
    expected = x.clone()
    dist.all_reduce(expected)
    row = {"bytes": size, "nccl_us": time_ms(lambda: dist.all_reduce(x.clone())) * 1e3}
    if all_reduce.symm_mem is not None and all_reduce.symm_mem.fits(x):
        torch.testing.assert_close(all_reduce(x.clone()), expected, atol=0.05, rtol=0.02)
        row["one_shot_us"] = time_ms(lambda: all_reduce(x.clone())) * 1e3
    return row


def bench_all_reduce() -> list[dict]:
    import torch.distributed as dist

    from kvrouter.engine.parallel.all_reduce import AllReduce

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl")
    all_reduce = AllReduce(dist.group.WORLD, torch.device("cuda"))
    rows = [all_reduce_row(all_reduce, size) for size in ALL_REDUCE_BYTES]
    dist.destroy_process_group()
    return rows if rank == 0 else []


def print_table(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    columns = list(dict.fromkeys(column for row in rows for column in row))
    print("  " + "  ".join(f"{column:>20}" for column in columns))
    for row in rows:
        cells = [_cell(row.get(column)) for column in columns]
        print("  " + "  ".join(f"{cell:>20}" for cell in cells))


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="kernel_benchmark.json")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("kernel_benchmark needs a CUDA device", file=sys.stderr)
        return 2
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        results = {"all_reduce": bench_all_reduce()}
        print_table("all-reduce latency (us)", results["all_reduce"])
    else:
        dtype = getattr(torch, args.dtype)
        copy_tbs = copy_bandwidth_tbs()
        results = {
            "device": torch.cuda.get_device_name(),
            "dtype": args.dtype,
            "copy_tbs": copy_tbs,
            "decode": [decode_row(b, n, dtype, copy_tbs) for b, n in DECODE_SHAPES],
            "prefill": [prefill_row(b, n, dtype) for b, n in PREFILL_SHAPES],
        }
        print(f"device-to-device copy: {copy_tbs:.2f} TB/s")
        print_table("paged decode attention (KV bytes read)", results["decode"])
        print_table("prefill attention (causal)", results["prefill"])
    if int(os.environ.get("RANK", "0")) == 0:
        with open(args.out, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
