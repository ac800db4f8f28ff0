"""The simulated engine's timing model: continuous batching with chunked
prefill, in the manner of vLLM.

Every iteration runs one decode token for each running request, plus up to
`max_batched_tokens` minus that many prefill tokens, taken first-come
first-served. An iteration takes

    (prefill_iteration_ms if it carries prefill tokens else decode_iteration_ms)
    + prefill_ms_per_token * c + attention_ms_per_token2 * c * (p + c / 2)
    + decode_ms_per_kv_token * (KV tokens of the running decodes)

for a prefill chunk of c tokens after p tokens already in cache. The defaults
were fitted to Dynamo's mocker (ai-dynamo-runtime 1.6.1, its default engine)
on requests that found their worker idle; docs/routing.md has the fit."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimingModel:
    max_batched_tokens: int = 8192
    prefill_iteration_ms: float = 15.3
    decode_iteration_ms: float = 5.74
    prefill_ms_per_token: float = 0.018
    attention_ms_per_token2: float = 7.1e-9
    decode_ms_per_kv_token: float = 5.0e-5
    # KV transfer from a prefill worker to a decode worker (P/D mode).
    transfer_ms_per_block: float = 0.1

    def chunk_ms(self, chunk: int, prefix: int) -> float:
        return self.prefill_ms_per_token * chunk + self.attention_ms_per_token2 * chunk * (
            prefix + chunk / 2
        )

    def lone_prefill_ms(self, input_tokens: int, cached_tokens: int) -> float:
        """Time to first token of a prompt that finds its worker idle and
        runs alone: one prefill iteration per `max_batched_tokens` chunk, at
        least one even when every token is cached."""
        ms, done = 0.0, cached_tokens
        while True:
            chunk = min(self.max_batched_tokens, input_tokens - done)
            ms += self.prefill_iteration_ms + self.chunk_ms(chunk, done)
            done += chunk
            if done >= input_tokens:
                return ms
