"""Sampling keeps exactly the tokens top-k and top-p allow; a row that
cannot be sampled fails its sequence alone; bad settings are refused."""

import math

import pytest
import torch

from kvrouter.engine.sampler import NO_TOKEN, sample, token_logprobs
from kvrouter.engine.sampling_params import SamplingParams
from kvrouter.engine.sequence import Sequence

# Probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1.
LOGITS = torch.tensor([[math.log(p) for p in (0.3, 0.5, 0.05, 0.15)]])


def draws(params: SamplingParams, count: int = 300) -> set[int]:
    seq = Sequence("r", [1], params)
    return {sample(LOGITS, [seq])[0] for _ in range(count)}


def test_greedy_takes_the_most_likely_token():
    assert draws(SamplingParams(), count=3) == {1}


def test_top_p_keeps_the_smallest_set_reaching_p():
    assert draws(SamplingParams(temperature=1.0, top_p=0.5, seed=0)) == {1}
    assert draws(SamplingParams(temperature=1.0, top_p=0.75, seed=0)) == {0, 1}
    assert draws(SamplingParams(temperature=1.0, top_p=0.9, seed=0)) == {0, 1, 3}


def test_top_k_keeps_the_k_most_likely_tokens():
    assert draws(SamplingParams(temperature=1.0, top_k=2, seed=0)) == {0, 1}


def test_without_cuts_every_token_can_be_drawn():
    assert draws(SamplingParams(temperature=1.0, seed=0), count=1000) == {0, 1, 2, 3}


def test_same_seed_same_draws():
    params = SamplingParams(temperature=1.0, seed=42)
    first, second = Sequence("a", [1], params), Sequence("b", [1], params)
    assert [sample(LOGITS, [first])[0] for _ in range(20)] == [
        sample(LOGITS, [second])[0] for _ in range(20)
    ]


def test_a_row_with_non_finite_logits_fails_alone():
    logits = torch.cat([LOGITS, torch.full_like(LOGITS, float("nan")), LOGITS])
    logits[2, 0] = float("inf")
    seqs = [Sequence(name, [1], SamplingParams(temperature=1.0, seed=0)) for name in "abc"]
    tokens = sample(logits, seqs)
    assert tokens[1:] == [NO_TOKEN, NO_TOKEN] and tokens[0] != NO_TOKEN
    assert seqs[0].failure is None and "not finite" in seqs[1].failure


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", float("nan")),
        ("temperature", 1e-45),
        ("temperature", -0.5),
        ("top_p", 0.0),
        ("top_p", float("nan")),
        ("top_k", -1),
        ("max_tokens", 0),
        ("logprobs", -1),
        ("logprobs", 21),
    ],
)
def test_bad_settings_are_refused(field, value):
    with pytest.raises(ValueError, match=f"sampling.{field}"):
        SamplingParams(**{field: value})


def test_logprobs_are_the_raw_distribution_s_whatever_the_sampling():
    # Temperature and top-k change the draw, not the log probabilities reported.
    asks = Sequence("asks", [1], SamplingParams(temperature=0.5, top_k=2, seed=0, logprobs=2))
    quiet = Sequence("quiet", [1], SamplingParams())
    logits = LOGITS.repeat(2, 1)
    found = token_logprobs(logits, [asks, quiet], [0, 1])
    assert found[1] is None
    assert found[0].logprob == pytest.approx(math.log(0.3))
    assert [token for token, _ in found[0].top] == [1, 0]
    assert [lp for _, lp in found[0].top] == pytest.approx([math.log(0.5), math.log(0.3)])


def test_logprobs_zero_gives_the_chosen_token_s_alone_and_no_token_none():
    seq = Sequence("r", [1], SamplingParams(logprobs=0))
    assert token_logprobs(LOGITS, [seq], [3])[0].top == ()
    assert token_logprobs(LOGITS, [seq], [NO_TOKEN]) == [None]


def test_more_logprobs_than_the_vocabulary_gives_every_token():
    seq = Sequence("r", [1], SamplingParams(logprobs=5))
    (found,) = token_logprobs(LOGITS, [seq], [1])
    assert [token for token, _ in found.top] == [1, 0, 3, 2]
