#!/usr/bin/env bash
# The engine's GPU check, for a machine with an NVIDIA GPU, torch and triton.
# From the repository root:
#   bash bench/gpu_check.sh [RESULTS_DIR]      (default bench/results/gpu)
# Steps, each bounded in time and logged to RESULTS_DIR; a failing step does
# not stop the next, and the script exits non-zero if any failed:
#   1. on CUDA: the kernel tests (fp32, fp16, bf16), the model against HF
#      transformers, and the all-reduce paths one GPU can run (pytest.log);
#      alongside, end to end: 100 greedy requests through a router to CPU
#      and then to CUDA workers, tokens compared (gpu_e2e.json, e2e.log);
#   2. alone on the GPU: kernel_benchmark (kernels.json, bench.log);
#   3. with 2+ GPUs: the all-reduce benchmark under torchrun (allreduce.json).
# Where kvrouter's dependencies are missing, wheels in .whl/ (see
# docs/benchmarks.md, "The engine on a GPU") are installed first.
set -uo pipefail
cd "$(dirname "$0")/.."
results="${1:-bench/results/gpu}"
mkdir -p "$results"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
    # Into the interpreter's own environment: beside it on PYTHONPATH, an older
    # protobuf there can still win the `google` package.
    python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade .whl/*.whl || exit 1
fi
# The engine imports the Rust core; build it here if this checkout lacks it.
python3 -c "import kvrouter._core" 2>/dev/null || python3 -m pip install -q -e ".[test]" ||
    { echo "gpu_check: kvrouter's core is not built and could not be" >&2; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
python3 -c "import torch, triton, grpc, google.protobuf, kvrouter._core, kvrouter.proto_gen.router_pb2
assert torch.cuda.is_available(), 'no CUDA device'
print('torch', torch.__version__, 'triton', triton.__version__, 'grpc', grpc.__version__,
      'protobuf', google.protobuf.__version__, torch.cuda.get_device_name())" || exit 1

failed=0
step() {  # step NAME SECONDS COMMAND...: runs COMMAND, logged to RESULTS/NAME.log
    local name=$1 seconds=$2
    shift 2
    local started=$SECONDS
    timeout "$seconds" "$@" >"$results/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - started)) s"
    tail -n 25 "$results/$name.log"
    return $rc
}

echo "== CUDA tests and end to end, side by side"
timeout 240 python3 -m pytest -q -p no:cacheprovider -o timeout=180 tests/engine/test_kernels.py \
    tests/engine/test_model_vs_hf.py tests/engine/test_all_reduce_cuda.py -rs -s \
    >"$results/pytest.log" 2>&1 &
tests=$!
step e2e 200 python3 bench/gpu_e2e.py --out "$results/gpu_e2e.json" || failed=1
wait $tests
rc=$?
echo "== pytest: exit $rc"
tail -n 25 "$results/pytest.log"
[ $rc -eq 0 ] || failed=1

step bench 300 python3 -m kvrouter.engine.kernel_benchmark --out "$results/kernels.json" || failed=1

if [ "$(python3 -c 'import torch; print(torch.cuda.device_count())')" -gt 1 ]; then
    step allreduce 120 torchrun --nproc-per-node=2 -m kvrouter.engine.kernel_benchmark \
        --out "$results/allreduce.json" || failed=1
else
    echo "== all-reduce benchmark skipped: one GPU"
fi
exit $failed
