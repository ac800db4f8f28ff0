#!/usr/bin/env bash
# The engine's GPU check, for a machine with an NVIDIA GPU and torch + triton
# installed (run from the repository root):
#   - the kernel tests, bf16 included, on CUDA;
#   - paged decode attention bandwidth against the device copy and SDPA,
#     prefill attention TFLOP/s;
#   - all-reduce latency against NCCL when there is more than one GPU.
# Results go to bench/results/kernels.json (and allreduce.json).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/results
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"
# The engine imports the Rust core; build it here if this checkout lacks it.
python -c "import kvrouter._core" 2>/dev/null || pip install -q -e ".[test]"

echo "== kernel tests on CUDA"
python -m pytest -q tests/engine/test_kernels.py

echo "== kernel benchmark"
python -m kvrouter.engine.kernel_benchmark --out bench/results/kernels.json

if [ "$(nvidia-smi -L | wc -l)" -gt 1 ]; then
    echo "== all-reduce benchmark"
    torchrun --nproc-per-node=2 -m kvrouter.engine.kernel_benchmark --out bench/results/allreduce.json
else
    echo "== all-reduce benchmark skipped: one GPU"
fi
