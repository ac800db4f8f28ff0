"""The any-router floor: for each request, a TTFT that no routing policy can
beat in this simulator, whatever the worker count, capacity or arrival speed.

Each request is priced as if it had every block of every earlier request
cached (one infinite cache shared by all workers) and its prefill ran in the
cheapest chunks any schedule could give it: `TimingModel.min_prefill_ms`.
Why no placement does better, request by request:

- Cache hits. A worker's cache only ever holds blocks of requests admitted
  to it, and a worker admits its queue first come, first served, so a hit
  is a prefix of blocks that earlier requests carried. (Blocks count from
  admission, before they are computed; the floor counts them from arrival.)
- Compute. An iteration carrying a chunk of c of the prompt's tokens costs
  at least `prefill_ms(c)`: the batch's rounding (`batch_prefill_ms`) drops
  at most a token for each other chunk, which brings at least one; other
  chunks in the same iteration, decode steps and queueing only add time.
  No chunk exceeds `max_batched_tokens`, and `min_prefill_ms` is the least
  the chunks' `prefill_ms` can sum to. It grows with the uncached tokens n.

So the floor is below the simulator's TTFT for every request, hence below
its mean and every percentile.

`pooled_lru_reference` is tighter but not a bound: the workers' capacity
pooled into one LRU cache (the simulator's `BlockCache`), requests in
arrival order, each prefilled alone. It is what a router would get if its
workers' caches behaved as one and nothing ever queued; a placement that
beats LRU's choice of what to keep could still do better."""

from __future__ import annotations

from kvrouter.replay.cache import BlockCache
from kvrouter.replay.report import distribution
from kvrouter.replay.simulator import ReplayConfig
from kvrouter.replay.trace import TraceRequest, engine_blocks, reusable_blocks


def floor_per_request(trace: list[TraceRequest], cfg: ReplayConfig) -> list[tuple[float, int]]:
    """(floor TTFT ms, reused tokens) for each request, in trace order."""
    seen: set[int] = set()
    out = []
    for t in trace:
        blocks = engine_blocks(t, cfg.trace_block_size, cfg.block_size)
        hit, most = 0, reusable_blocks(t.input_length, cfg.block_size)
        while hit < min(len(blocks), most) and blocks[hit] in seen:
            hit += 1
        cached = hit * cfg.block_size
        out.append((cfg.timing.min_prefill_ms(t.input_length, cached), cached))
        seen.update(blocks)
    return out


def any_router_floor(trace: list[TraceRequest], cfg: ReplayConfig) -> dict:
    """The floor's reuse and TTFT distribution, in the replay report's keys."""
    return _summary("any-router floor", trace, floor_per_request(trace, cfg))


def pooled_lru_per_request(trace: list[TraceRequest], cfg: ReplayConfig) -> list[tuple[float, int]]:
    """(TTFT ms alone, reused tokens) for each request with the workers'
    capacity pooled into one LRU cache, in trace order."""
    cache = BlockCache(cfg.num_workers * cfg.capacity_blocks)
    out = []
    for t in trace:
        blocks = engine_blocks(t, cfg.trace_block_size, cfg.block_size)
        hit = cache.hit_length(blocks)
        cached = min(hit, reusable_blocks(t.input_length, cfg.block_size)) * cfg.block_size
        out.append((cfg.timing.lone_prefill_ms(t.input_length, cached), cached))
        if cache.admit(blocks, hit, 0) is not None:
            cache.release(blocks, 0)
    return out


def _summary(name: str, trace: list[TraceRequest], per_request: list[tuple[float, int]]) -> dict:
    input_tokens = sum(t.input_length for t in trace)
    reused = sum(cached for _, cached in per_request)
    ttft = [ms for ms, _ in per_request]
    return {
        "policy": name,
        "num_requests": len(trace),
        "prefix_reuse_ratio": reused / input_tokens if input_tokens else 0.0,
        "ttft_ms": distribution(ttft),
        "ttft_samples_ms": ttft,
    }


def pooled_lru_reference(trace: list[TraceRequest], cfg: ReplayConfig) -> dict:
    """The pooled-LRU reference's reuse and TTFT distribution."""
    return _summary("pooled LRU, alone", trace, pooled_lru_per_request(trace, cfg))
