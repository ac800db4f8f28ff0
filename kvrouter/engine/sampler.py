"""Next-token choice: greedy, or temperature with top-k/top-p.

A row that cannot be sampled (its logits are not finite, or drawing fails)
gets NO_TOKEN and its sequence records why: that sequence fails alone, and
the rest of the batch goes on. Non-finite values never reach
torch.multinomial, which on CUDA would assert and break the device for
every request.

Log probabilities, for the sequences that ask, are those of the raw logits
(before temperature, top-k and top-p), as vLLM reports by default: what the
model thinks of the token, whatever the sampling did."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from kvrouter.engine.sequence import Sequence

log = logging.getLogger("kvrouter.engine.sampler")

NO_TOKEN = -1


@dataclass(frozen=True)
class TokenLogprobs:
    """A chosen token's log probability, and the `top` most likely tokens'
    as (token id, log probability), most likely first."""

    logprob: float
    top: tuple[tuple[int, float], ...]


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
    """One token per row of `logits` [rows, vocab] (fp32), for the matching
    sequence, or NO_TOKEN for a row that cannot be sampled."""
    if not seqs:
        return []
    finite = torch.isfinite(logits).all(dim=-1)
    tokens = torch.where(finite, logits.argmax(dim=-1), NO_TOKEN).tolist()
    for row, seq in enumerate(seqs):
        if tokens[row] == NO_TOKEN:
            seq.failure = "the model's logits for this request are not finite"
        elif not seq.params.greedy:
            try:
                tokens[row] = _sample_row(logits[row], seq)
            except Exception as e:
                log.exception("sampling failed", extra={"fields": {"request_id": seq.request_id}})
                seq.failure = f"sampling failed: {e}"
                tokens[row] = NO_TOKEN
    return tokens


def _sample_row(logits: torch.Tensor, seq: Sequence) -> int:
    params = seq.params
    if seq.generator is None:
        # Seeded requests repeat exactly; unseeded ones draw a fresh seed once.
        seq.generator = torch.Generator(device=logits.device)
        if params.seed is None:
            seq.generator.seed()
        else:
            seq.generator.manual_seed(params.seed)
    scaled = logits / params.temperature
    if not bool(torch.isfinite(scaled).all()):
        raise ValueError(f"logits / temperature {params.temperature} overflow")
    probs = torch.softmax(scaled, dim=-1)
    sorted_probs, order = probs.sort(descending=True)
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    if params.top_k:
        keep[params.top_k :] = False
    if params.top_p < 1.0:
        # Keep the smallest prefix whose mass reaches top_p (always the top token).
        mass_before = sorted_probs.cumsum(0) - sorted_probs
        keep &= mass_before < params.top_p
    sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
    choice = torch.multinomial(sorted_probs, 1, generator=seq.generator)
    return int(order[choice])


def token_logprobs(
    logits: torch.Tensor, seqs: list[Sequence], tokens: list[int]
) -> list[TokenLogprobs | None]:
    """Per row, the log probabilities of `tokens[row]` (as `sample` chose it)
    for a sequence that asks for them (`SamplingParams.logprobs`); None for
    the others and for NO_TOKEN. One log-softmax over the rows that ask."""
    rows = [
        row
        for row, seq in enumerate(seqs)
        if seq.params.logprobs is not None and tokens[row] != NO_TOKEN
    ]
    found: list[TokenLogprobs | None] = [None] * len(seqs)
    if not rows:
        return found
    logprobs = torch.log_softmax(logits[rows], dim=-1)
    chosen = logprobs[torch.arange(len(rows)), [tokens[row] for row in rows]].tolist()
    # A vocabulary smaller than the count asked gives every token.
    widest = min(max(seqs[row].params.logprobs for row in rows), logprobs.shape[-1])
    top_values, top_ids = logprobs.topk(widest, dim=-1) if widest else (None, None)
    for i, row in enumerate(rows):
        count = seqs[row].params.logprobs
        top = ()
        if count:
            ids, values = top_ids[i, :count].tolist(), top_values[i, :count].tolist()
            top = tuple(zip(ids, values, strict=True))
        found[row] = TokenLogprobs(chosen[i], top)
    return found
