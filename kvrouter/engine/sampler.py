"""Next-token choice: greedy, or temperature with top-k/top-p."""

from __future__ import annotations

import torch

from kvrouter.engine.sequence import Sequence


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
    """One token per row of `logits` [rows, vocab] (fp32), for the matching sequence."""
    if not seqs:
        return []
    tokens = logits.argmax(dim=-1).tolist()
    for row, seq in enumerate(seqs):
        if not seq.params.greedy:
            tokens[row] = _sample_row(logits[row], seq)
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
    probs = torch.softmax(logits / params.temperature, dim=-1)
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
