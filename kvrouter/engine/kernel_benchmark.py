"""GPU kernel benchmark: `python -m kvrouter.engine.kernel_benchmark [--out results.json]`.

Prints one table per kernel and writes the numbers as JSON. Every figure is
set against a ceiling or a peer measured in the same run:
- the device-to-device copy (bytes read plus bytes written): the ceiling;
- paged decode attention at batch 1-256 and context 1k-128k: KV bytes read
  per second, with the default launch and with the best launch of a sweep,
  against the copy and against torch SDPA on contiguous KV;
- prefill attention: causal TFLOP/s, default and best launch, against torch
  SDPA on contiguous tensors;
- KV write: bytes read plus written per second, against the copy;
- all-reduce (under torchrun with 2+ GPUs): latency of the symmetric-memory
  one-shot path against NCCL.

Times are medians of `triton.testing.do_bench` (CUDA events, the L2 cache
flushed before each run). Needs CUDA; on a CPU-only machine it exits with a
message.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

DEVICE = "cuda"
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 16
DECODE_BATCHES = (1, 8, 32, 64, 256)
DECODE_CONTEXTS = (1024, 8192, 32768, 131072)
# Shapes past this many cached tokens are left out: 8M tokens are 32 GiB of
# bf16 K and V, held twice (paged, and contiguous for SDPA).
MAX_DECODE_TOKENS = 1 << 23
# The target: paged decode reads KV at >= 70% of the copy bandwidth here.
TARGET_FRACTION, TARGET_MIN_BATCH, TARGET_MIN_CONTEXT = 0.7, 32, 8192
DECODE_TUNE_SHAPES = ((32, 8192), (64, 32768), (256, 8192))
DECODE_SWEEP = {"block_n": (32, 64, 128), "num_warps": (2, 4, 8), "num_stages": (2, 3, 4)}
DECODE_PROGRAMS_PER_SM = (2, 4, 8, 16)
PREFILL_SHAPES = ((1, 4096), (4, 2048), (16, 512), (1, 16384))
PREFILL_TUNE_SHAPE = (1, 4096)
PREFILL_SWEEP = {"block_m": (64, 128), "block_n": (32, 64), "num_warps": (4, 8)}
KV_WRITE_TOKENS = (4096, 65536)
ALL_REDUCE_BYTES = (8 * 1024, 64 * 1024, 256 * 1024, 4 * 1024 * 1024)


def time_ms(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def time_collective_ms(fn, iterations: int = 50) -> float:
    """Mean ms of `fn`, a collective: every rank calls it the same number of
    times (do_bench sizes its repeats by each rank's own estimate, which would
    pair one rank's calls with another's next ones)."""
    import torch.distributed as dist

    for _ in range(5):
        fn()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iterations


def release() -> None:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def copy_bandwidth_tbs() -> float:
    src = torch.randint(0, 255, (1 << 31,), dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3) / 1e12


def paged_cache(num_seqs: int, context_len: int, dtype: torch.dtype):
    pages_per_seq = -(-context_len // PAGE_SIZE)
    num_pages = num_seqs * pages_per_seq
    shape = (num_pages, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, dtype=dtype, device=DEVICE)
    v_cache = torch.randn(shape, dtype=dtype, device=DEVICE)
    # Shuffled pages, as a long-running cache would hold them.
    block_tables = torch.randperm(num_pages, device=DEVICE, dtype=torch.int32)
    block_tables = block_tables.view(num_seqs, pages_per_seq)
    return k_cache, v_cache, block_tables


class DecodeCase:
    """One decode shape's inputs, timed under any launch configuration."""

    def __init__(self, batch: int, context_len: int, dtype: torch.dtype) -> None:
        self.batch, self.context_len = batch, context_len
        self.k_cache, self.v_cache, self.block_tables = paged_cache(batch, context_len, dtype)
        self.context_lens = torch.full((batch,), context_len, dtype=torch.int32, device=DEVICE)
        self.query = torch.randn(batch, NUM_HEADS, HEAD_DIM, dtype=dtype, device=DEVICE)
        self.kv_bytes = 2 * batch * context_len * NUM_KV_HEADS * HEAD_DIM * dtype.itemsize

    def kernel(self, launch: dict):
        """The decode call under `launch`, its arguments settled before any
        timing starts."""
        from kvrouter.engine.kernels.triton_decode import (
            choose_num_splits,
            paged_decode_attention_triton,
            resolve_launch,
        )

        launch = dict(launch)
        programs_per_sm = launch.pop("programs_per_sm", None)
        if programs_per_sm is not None:
            launch["num_splits"] = choose_num_splits(
                self.query.device,
                self.batch,
                NUM_KV_HEADS,
                self.context_len,
                resolve_launch(self.batch, launch.get("block_n")).block_n,
                programs_per_sm,
            )
        args = (self.query, self.k_cache, self.v_cache, self.block_tables, self.context_lens)
        return lambda: paged_decode_attention_triton(
            *args, HEAD_DIM**-0.5, self.context_len, **launch
        )

    def tbs(self, launch: dict) -> float:
        return self.kv_bytes / (time_ms(self.kernel(launch)) * 1e-3) / 1e12

    def sdpa_tbs(self) -> float:
        """SDPA on the same KV laid out contiguously; a KV head's query heads
        are its query rows, so no backend needs to repeat K and V."""
        group = NUM_HEADS // NUM_KV_HEADS
        query = self.query.view(self.batch, NUM_KV_HEADS, group, HEAD_DIM)
        shape = (self.batch, NUM_KV_HEADS, self.context_len, HEAD_DIM)
        key = torch.randn(shape, dtype=self.query.dtype, device=DEVICE)
        value = torch.randn_like(key)
        ms = time_ms(lambda: F.scaled_dot_product_attention(query, key, value))
        return self.kv_bytes / (ms * 1e-3) / 1e12


def sweep(space: dict) -> list[dict]:
    return [dict(zip(space, values, strict=True)) for values in itertools.product(*space.values())]


def best_launch(cases: list, launches: list[dict], score) -> dict:
    """The launch whose worst score over `cases` is highest; a launch that
    fails to compile or run (resources) is skipped."""
    best, best_score = {}, 0.0
    for launch in launches:
        try:
            worst = min(score(case, launch) for case in cases)
        except Exception as error:  # noqa: BLE001 - an infeasible launch is skipped
            print(f"  launch {launch} skipped: {type(error).__name__}: {error}"[:200])
            continue
        if worst > best_score:
            best, best_score = launch, worst
    return best


def tune_decode(dtype: torch.dtype) -> dict:
    cases = [DecodeCase(batch, context, dtype) for batch, context in DECODE_TUNE_SHAPES]
    launch = best_launch(cases, sweep(DECODE_SWEEP), DecodeCase.tbs)
    splits = [{**launch, "programs_per_sm": n} for n in DECODE_PROGRAMS_PER_SM]
    launch = best_launch(cases, splits, DecodeCase.tbs)
    del cases
    release()
    return launch


def decode_rows(dtype: torch.dtype, copy_tbs: float, tuned: dict) -> list[dict]:
    rows = []
    for batch, context_len in itertools.product(DECODE_BATCHES, DECODE_CONTEXTS):
        if batch * context_len > MAX_DECODE_TOKENS:
            continue
        case = DecodeCase(batch, context_len, dtype)
        default_tbs, tuned_tbs = case.tbs({}), case.tbs(tuned)
        rows.append(
            {
                "batch": batch,
                "context": context_len,
                "default_tbs": default_tbs,
                "tuned_tbs": tuned_tbs,
                "sdpa_contiguous_tbs": case.sdpa_tbs(),
                "default_of_copy": default_tbs / copy_tbs,
                "tuned_of_copy": tuned_tbs / copy_tbs,
            }
        )
        del case
        release()
    return rows


class PrefillCase:
    """A batch of whole prompts, their KV already written to the paged cache."""

    def __init__(self, num_seqs: int, seq_len: int, dtype: torch.dtype) -> None:
        from kvrouter.engine.kernels.triton_kv_write import write_kv_triton

        self.num_seqs, self.seq_len = num_seqs, seq_len
        self.k_cache, self.v_cache, self.block_tables = paged_cache(num_seqs, seq_len, dtype)
        tokens = num_seqs * seq_len
        self.query = torch.randn(tokens, NUM_HEADS, HEAD_DIM, dtype=dtype, device=DEVICE)
        self.key = torch.randn(tokens, NUM_KV_HEADS, HEAD_DIM, dtype=dtype, device=DEVICE)
        self.value = torch.randn_like(self.key)
        positions = torch.arange(seq_len, device=DEVICE)
        pages = self.block_tables.long()[:, positions // PAGE_SIZE]
        slots = (pages * PAGE_SIZE + positions % PAGE_SIZE).flatten()
        write_kv_triton(self.key, self.value, self.k_cache, self.v_cache, slots)
        self.cu_seqlens = torch.arange(0, tokens + 1, seq_len, dtype=torch.int32, device=DEVICE)
        self.context_lens = torch.full((num_seqs,), seq_len, dtype=torch.int32, device=DEVICE)
        self.flops = 4 * num_seqs * seq_len * seq_len * NUM_HEADS * HEAD_DIM / 2

    def kernel(self, launch: dict):
        """The prefill call under `launch`, imported before any timing starts."""
        from kvrouter.engine.kernels.triton_prefill import paged_prefill_attention_triton

        args = (self.query, self.k_cache, self.v_cache, self.block_tables, self.cu_seqlens)
        return lambda: paged_prefill_attention_triton(
            *args, self.context_lens, HEAD_DIM**-0.5, self.seq_len, **launch
        )

    def tflops(self, launch: dict) -> float:
        return self.flops / (time_ms(self.kernel(launch)) * 1e-3) / 1e12

    def sdpa_tflops(self) -> float:
        """Causal SDPA on contiguous tensors, K and V repeated to every query
        head beforehand (outside the timing) so the flash backend applies."""
        group = NUM_HEADS // NUM_KV_HEADS

        def heads_first(x: torch.Tensor) -> torch.Tensor:
            return x.view(self.num_seqs, self.seq_len, -1, HEAD_DIM).transpose(1, 2)

        query = heads_first(self.query)
        key = heads_first(self.key).repeat_interleave(group, dim=1)
        value = heads_first(self.value).repeat_interleave(group, dim=1)
        ms = time_ms(lambda: F.scaled_dot_product_attention(query, key, value, is_causal=True))
        return self.flops / (ms * 1e-3) / 1e12


def prefill_rows(dtype: torch.dtype) -> tuple[dict, list[dict]]:
    tune_case = PrefillCase(*PREFILL_TUNE_SHAPE, dtype)
    tuned = best_launch([tune_case], sweep(PREFILL_SWEEP), PrefillCase.tflops)
    del tune_case
    rows = []
    for num_seqs, seq_len in PREFILL_SHAPES:
        case = PrefillCase(num_seqs, seq_len, dtype)
        rows.append(
            {
                "seqs": num_seqs,
                "seq_len": seq_len,
                "default_tflops": case.tflops({}),
                "tuned_tflops": case.tflops(tuned),
                "sdpa_tflops": case.sdpa_tflops(),
            }
        )
        del case
        release()
    return tuned, rows


def kv_write_row(tokens: int, dtype: torch.dtype, copy_tbs: float) -> dict:
    from kvrouter.engine.kernels.triton_kv_write import write_kv_triton

    k_cache, v_cache, _ = paged_cache(1, 2 * tokens, dtype)
    key = torch.randn(tokens, NUM_KV_HEADS, HEAD_DIM, dtype=dtype, device=DEVICE)
    value = torch.randn_like(key)
    # A random half of the cache's slots: new tokens land on scattered pages.
    slots = torch.randperm(2 * tokens, device=DEVICE)[:tokens]
    moved = 4 * key.numel() * dtype.itemsize
    ms = time_ms(lambda: write_kv_triton(key, value, k_cache, v_cache, slots))
    tbs = moved / (ms * 1e-3) / 1e12
    return {"tokens": tokens, "tbs": tbs, "of_copy": tbs / copy_tbs}


def kv_write_rows(dtype: torch.dtype, copy_tbs: float) -> list[dict]:
    rows = []
    for tokens in KV_WRITE_TOKENS:
        rows.append(kv_write_row(tokens, dtype, copy_tbs))
        release()
    return rows


def all_reduce_row(all_reduce, size: int) -> dict:
    import torch.distributed as dist

    x = torch.randn(size // 2, dtype=torch.bfloat16, device=DEVICE)
    expected = x.clone()
    dist.all_reduce(expected)
    row = {"bytes": size, "nccl_us": time_collective_ms(lambda: dist.all_reduce(x.clone())) * 1e3}
    if all_reduce.symm_mem is not None and all_reduce.symm_mem.fits(x):
        torch.testing.assert_close(all_reduce(x.clone()), expected, atol=0.05, rtol=0.02)
        row["one_shot_us"] = time_collective_ms(lambda: all_reduce(x.clone())) * 1e3
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
    print("  " + "  ".join(f"{column:>19}" for column in columns))
    for row in rows:
        cells = [_cell(row.get(column)) for column in columns]
        print("  " + "  ".join(f"{cell:>19}" for cell in cells))


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def decode_verdict(rows: list[dict], column: str) -> str:
    judged = [
        row
        for row in rows
        if row["batch"] >= TARGET_MIN_BATCH and row["context"] >= TARGET_MIN_CONTEXT
    ]
    if not judged:
        return "no row is at the target's batch and context"
    met = sum(row[column] >= TARGET_FRACTION for row in judged)
    worst = min(row[column] for row in judged)
    target = f"{TARGET_FRACTION:.0%}"
    return f"{met} of {len(judged)} rows at >= {target} of the copy (worst {worst:.1%})"


def single_gpu(dtype: torch.dtype, out_path: str) -> dict:
    started = time.monotonic()
    results: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "dtype": str(dtype).removeprefix("torch."),
    }

    def save(section: str, value) -> None:
        results[section] = value
        with open(out_path, "w") as out:
            json.dump(results, out, indent=2)
        print(f"[{time.monotonic() - started:.0f} s] {section} done", flush=True)

    import triton

    save("triton", triton.__version__)
    copy_tbs = copy_bandwidth_tbs()
    save("copy_tbs", copy_tbs)
    print(f"device-to-device copy: {copy_tbs:.2f} TB/s", flush=True)
    save("decode_tuned_launch", tune_decode(dtype))
    print(f"decode: best launch {results['decode_tuned_launch']}", flush=True)
    save("decode", decode_rows(dtype, copy_tbs, results["decode_tuned_launch"]))
    print_table("paged decode attention (KV bytes read, TB/s)", results["decode"])
    for column in ("default_of_copy", "tuned_of_copy"):
        print(f"decode target, {column}: {decode_verdict(results['decode'], column)}")
    tuned, rows = prefill_rows(dtype)
    save("prefill_tuned_launch", tuned)
    save("prefill", rows)
    print(f"prefill: best launch {tuned}")
    print_table("prefill attention (causal, TFLOP/s)", rows)
    save("kv_write", kv_write_rows(dtype, copy_tbs))
    print_table("KV write (bytes read + written, TB/s)", results["kv_write"])
    return results


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
        if int(os.environ.get("RANK", "0")) == 0:
            with open(args.out, "w") as out:
                json.dump(results, out, indent=2)
    else:
        single_gpu(getattr(torch, args.dtype), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
