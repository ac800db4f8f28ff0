"""`/metrics` under vLLM 0.33's names and labels (`model_name`, and
`engine`, the DP rank: always 0 here), the series the sidecar reads an
engine's load and KV capacity from (kvrouter/adapters/vllm/engine_load.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvrouter.engine import EngineLoad


def token_buckets(max_model_len: int) -> list[int]:
    """vLLM's 1-2-5 buckets for request token counts, up to the model's length."""
    buckets, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return buckets
            buckets.append(value)
        exponent += 1


class VllmMetrics:
    def __init__(
        self, model_name: str, max_model_len: int, block_size: int, num_gpu_blocks: int
    ) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name, "engine": "0"}
        names = list(labels)
        # vLLM's info gauge: its cache config as labels, the value 1.
        cache_config = {
            "engine": "0",
            "block_size": str(block_size),
            "num_gpu_blocks": str(num_gpu_blocks),
            "kv_cache_size_tokens": str(num_gpu_blocks * block_size),
        }
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            list(cache_config),
            registry=self.registry,
        ).labels(**cache_config).set(1)

        def labelled(kind, name: str, documentation: str, **kwargs):
            metric = kind(name, documentation, names, registry=self.registry, **kwargs)
            return metric.labels(**labels)

        self.running = labelled(
            Gauge, "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = labelled(
            Gauge, "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.kv_cache_usage = labelled(
            Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prompt_tokens = labelled(
            Counter, "vllm:prompt_tokens", "Number of prefill tokens processed."
        )
        self.generation_tokens = labelled(
            Counter, "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.request_prompt_tokens = labelled(
            Histogram,
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            buckets=token_buckets(max_model_len),
        )

    def finished(self, prompt_tokens: int, output_tokens: int) -> None:
        """Counts a request that ended (finished or aborted)."""
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(output_tokens)
        self.request_prompt_tokens.observe(prompt_tokens)

    def page(self, load: EngineLoad) -> bytes:
        """The Prometheus text, the gauges read from the engine's last step."""
        self.running.set(load.num_running)
        self.waiting.set(load.num_waiting)
        used = load.total_blocks - load.free_blocks
        self.kv_cache_usage.set(used / load.total_blocks if load.total_blocks else 0.0)
        return generate_latest(self.registry)
