"""Replay metrics: prefix reuse, TTFT / ITL / end-to-end latency, throughput
and load imbalance, plus the TTFT CDF plot."""

from __future__ import annotations

import numpy as np


def distribution(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    a = np.asarray(values)
    return {
        "mean": float(a.mean()),
        "p50": float(np.percentile(a, 50)),
        "p99": float(np.percentile(a, 99)),
    }


def summarize(policy, requests, workers, cfg, wall_s: float) -> dict:
    done = [r for r in requests if r.done_at is not None]
    ttft = [r.first_token - r.arrival for r in done]
    # Each request's TTFT had its prefill run alone with the hits it got; the
    # rest of its measured TTFT is queueing and batching with others.
    alone = [cfg.timing.lone_prefill_ms(r.input_length, r.reused) for r in done]
    e2e = [r.done_at - r.arrival for r in done]
    itl = [(r.done_at - r.first_token) / (r.output_length - 1) for r in done if r.output_length > 1]
    input_tokens = sum(r.input_length for r in requests)
    span_s = (max(r.done_at for r in done) - min(r.arrival for r in requests)) / 1000 if done else 0
    per_worker = {w.id: 0 for w in workers}
    for r in requests:
        per_worker[r.prefill_worker if r.prefill_worker is not None else r.decode_worker] += (
            r.input_length - r.reused
        )
    busy = [w.busy_ms for w in workers]
    computed = list(per_worker.values())
    return {
        "policy": policy,
        "num_requests": len(requests),
        "completed": len(done),
        "num_workers": cfg.num_workers,
        "num_prefill_workers": cfg.num_prefill_workers,
        "prefix_reuse_ratio": sum(r.reused for r in requests) / input_tokens if input_tokens else 0,
        "ttft_ms": distribution(ttft),
        "ttft_alone_ms": distribution(alone),
        "itl_ms": distribution(itl),
        "e2e_ms": distribution(e2e),
        "throughput": {
            "requests_per_s": len(done) / span_s if span_s else 0.0,
            "output_tokens_per_s": sum(r.output_length for r in done) / span_s if span_s else 0.0,
        },
        # max / mean over workers of busy time and of prefill tokens computed.
        "imbalance": {
            "busy_time": max(busy) / (sum(busy) / len(busy)) if sum(busy) else 1.0,
            "prefill_tokens": max(computed) / (sum(computed) / len(computed))
            if sum(computed)
            else 1.0,
        },
        "disaggregated_fraction": sum(r.prefill_worker is not None for r in requests)
        / max(len(requests), 1),
        "wall_s": wall_s,
        "ttft_samples_ms": ttft,
        "e2e_samples_ms": e2e,
    }


def plot_ttft_cdf(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for result in results:
        samples = np.sort(np.asarray(result["ttft_samples_ms"]))
        if len(samples):
            ax.plot(samples, np.arange(1, len(samples) + 1) / len(samples), label=result["policy"])
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT CDF per policy")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
