"""The simulated engine's timing model: continuous batching with chunked
prefill, in the manner of vLLM.

Every iteration runs one decode token for each running request, plus up to
`max_batched_tokens` minus that many prefill tokens, taken first-come
first-served. An iteration carrying N prefill tokens (counted as the
mocker counts them: `batch_prefill_ms`) while D requests decode takes

    prefill_ms(N)  = prefill_iteration_ms + prefill_ms_per_token * N
                     + prefill_ms_per_token2 * N^2            (if N > 0)
    + decode_ms(x) = decode_iteration_ms + decode_kv_linear_ms * x
                     + decode_kv_quadratic_ms * x^2           (if D > 0)

where x is the share of the KV cache the running decodes read: their context
tokens (a shared prefix counts once per request) over the cache's size,
capped at 1. The defaults reproduce Dynamo's mocker (ai-dynamo-runtime
1.6.1, its default engine); docs/routing.md has the measurements."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TimingModel:
    max_batched_tokens: int = 8192
    prefill_iteration_ms: float = 16.50142
    prefill_ms_per_token: float = 0.01518344
    prefill_ms_per_token2: float = 4.209989e-7
    decode_iteration_ms: float = 5.74
    decode_kv_linear_ms: float = 54.01
    decode_kv_quadratic_ms: float = -25.74
    # KV transfer from a prefill worker to a decode worker (P/D mode).
    transfer_ms_per_block: float = 0.1

    def prefill_ms(self, tokens: float) -> float:
        """An iteration's prefill share, for all its prefill tokens together."""
        return (
            self.prefill_iteration_ms
            + self.prefill_ms_per_token * tokens
            + self.prefill_ms_per_token2 * tokens * tokens
        )

    def batch_prefill_ms(self, spans: list[tuple[int, int]]) -> float:
        """An iteration's prefill share for the prompt chunks it carries,
        each the (start, end) of the prompt positions it computes. Dynamo's
        mocker prices a batch by its size and its chunks' mean end and mean
        start, each a whole number of tokens, so the tokens it pays for can
        miss their sum by up to the batch's size either way: chunks 0–523
        and 0–2,000 are priced as 2,522 tokens, and 8,192–8,257, 0–4,992
        and 0–3,135 as 8,193. Every span computes at least one token, so a
        chunk of c tokens is never priced under c."""
        count = len(spans)
        ends = sum(end for _, end in spans) // count
        starts = sum(start for start, _ in spans) // count
        return self.prefill_ms(count * (ends - starts))

    def decode_ms(self, kv_tokens: int, capacity_tokens: int) -> float:
        """An iteration's decode share, for running requests reading
        `kv_tokens` of context from a cache of `capacity_tokens`."""
        x = min(kv_tokens / capacity_tokens, 1.0)
        return self.decode_iteration_ms + x * (
            self.decode_kv_linear_ms + self.decode_kv_quadratic_ms * x
        )

    def decode_run_ms(
        self, kv_tokens: int, streams: int, steps: int, capacity_tokens: int
    ) -> float:
        """`steps` decode iterations in a row, each of the `streams` running
        requests adding a token of context to the `kv_tokens` the first one
        reads: the sum of their decode_ms, in closed form."""
        # Iterations before the share of the cache read reaches 1.
        n = min(max(math.ceil((capacity_tokens - kv_tokens) / max(streams, 1)), 0), steps)
        s1 = n * (n - 1) / 2  # sum of s over s < n
        s2 = (n - 1) * n * (2 * n - 1) / 6  # sum of s^2 over s < n
        a, b = kv_tokens / capacity_tokens, streams / capacity_tokens
        linear = n * a + b * s1
        square = n * a * a + 2 * a * b * s1 + b * b * s2
        uncapped = (
            n * self.decode_iteration_ms
            + self.decode_kv_linear_ms * linear
            + self.decode_kv_quadratic_ms * square
        )
        return uncapped + (steps - n) * self.decode_ms(capacity_tokens, capacity_tokens)

    def lone_prefill_ms(self, input_tokens: int, cached_tokens: int) -> float:
        """Time to first token of a prompt that finds its worker idle and
        runs alone: full `max_batched_tokens` chunks, then the rest, and at
        least one iteration even when every token is cached."""
        uncached = max(input_tokens - cached_tokens, 0)
        full, rest = divmod(uncached, self.max_batched_tokens)
        ms = full * self.prefill_ms(self.max_batched_tokens)
        return ms + self.prefill_ms(rest) if rest or not full else ms

    def min_prefill_ms(self, input_tokens: int, cached_tokens: int) -> float:
        """The least time any split of the uncached tokens into chunks of at
        most `max_batched_tokens` can take: k equal chunks cost
        k·iteration + per_token·n + per_token2·n²/k, convex in k, so the best
        k is the allowed one nearest sqrt(per_token2/iteration)·n."""
        n = max(input_tokens - cached_tokens, 0)
        fewest = max(-(-n // self.max_batched_tokens), 1)
        best = n * math.sqrt(self.prefill_ms_per_token2 / self.prefill_iteration_ms)
        candidates = {fewest, max(math.floor(best), fewest), max(math.ceil(best), fewest)}
        return min(k * self.prefill_ms(n / k) for k in candidates)
