"""Writes the `/metrics` page vLLM's own Prometheus logger produces for a
known scheduler state and KV cache size, as a fixture for the sidecar's
load and capacity reading (tests/adapters/test_engine_load.py). Needs
vLLM, in a venv of its own (its logger runs on the CPU):

    python -m venv /tmp/vllm && /tmp/vllm/bin/pip install vllm==0.33.0
    PYTHONPATH=. /tmp/vllm/bin/python scripts/capture_engine_metrics.py

Re-capture whenever a vLLM release renames its metrics. The state recorded
is written beside the page (`<page>.json`), so the test knows what to expect.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

# Two DP engines, each with its own queue, cache use and finished prompts.
ENGINES = {
    0: {"running": 3, "waiting": 2, "deferred": 1, "kv_cache_usage": 0.25, "prompts": [300, 500]},
    1: {"running": 1, "waiting": 0, "deferred": 0, "kv_cache_usage": 0.5, "prompts": [1000]},
}
# The KV blocks each DP engine sized at startup.
BLOCKS_PER_ENGINE = 2048


def main() -> int:
    try:
        import vllm
        from prometheus_client import REGISTRY, generate_latest
        from vllm.config import DeviceConfig, ModelConfig, VllmConfig
        from vllm.v1.engine import FinishReason
        from vllm.v1.metrics.loggers import PrometheusStatLogger
        from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, SchedulerStats
    except ImportError as e:
        print(f"capture_engine_metrics: needs vLLM ({e}); see this script's docstring")
        return 2
    from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint

    model = write_tiny_checkpoint(Path(tempfile.mkdtemp()))
    config = VllmConfig(
        model_config=ModelConfig(model=str(model), served_model_name="tiny"),
        device_config=DeviceConfig(device="cpu"),
    )
    # As vLLM's front end records its engines' ready messages
    # (MPClient._apply_ready_response): their blocks summed over the DP
    # engines, and the tokens one engine holds (kv_cache_size_tokens).
    cache = config.cache_config
    cache.num_gpu_blocks = BLOCKS_PER_ENGINE * len(ENGINES)
    cache.kv_cache_size_tokens = BLOCKS_PER_ENGINE * cache.block_size
    logger = PrometheusStatLogger(config, engine_indexes=list(ENGINES))
    logger.log_engine_initialized()
    for engine, state in ENGINES.items():
        iteration = IterationStats()
        iteration.finished_requests = [
            FinishedRequestStats(finish_reason=FinishReason.STOP, num_prompt_tokens=n)
            for n in state["prompts"]
        ]
        scheduler = SchedulerStats(
            num_running_reqs=state["running"],
            num_waiting_reqs=state["waiting"],
            num_skipped_waiting_reqs=state["deferred"],
            kv_cache_usage=state["kv_cache_usage"],
        )
        logger.record(scheduler, iteration, engine_idx=engine)
    out = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
    page = out / f"vllm-{vllm.__version__}-metrics.txt"
    page.write_bytes(generate_latest(REGISTRY))
    stated = {
        "num_gpu_blocks": cache.num_gpu_blocks,
        "block_size": cache.block_size,
        "kv_cache_size_tokens": cache.kv_cache_size_tokens,
    }
    recorded = {engine: {**state, **stated} for engine, state in ENGINES.items()}
    (out / f"{page.name}.json").write_text(json.dumps(recorded, indent=2) + "\n")
    print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
