"""Sampling: the masks against hand-computed cases, seeds, greedy, and parameter validation."""

import math

import pytest
import torch

from stages.common.errors import UserError
from stages.common.sampling import SamplingParams, min_p_mask, sample, top_k_mask, top_p_mask

NEG = float("-inf")


def kept(masked: torch.Tensor) -> list[list[int]]:
    return [torch.nonzero(row != NEG).flatten().tolist() for row in masked]


def test_top_k_keeps_the_k_largest_per_row():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0], [9.0, 1.0, 2.0, 0.0]])
    assert kept(top_k_mask(logits, torch.tensor([2, 1]))) == [[1, 3], [0]]
    # k <= 0 means no limit
    assert kept(top_k_mask(logits, torch.tensor([-1, 0]))) == [[0, 1, 2, 3], [0, 1, 2, 3]]


def test_top_p_keeps_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    assert kept(top_p_mask(logits, torch.tensor([0.5]))) == [[0]]  # 0.5 already reaches 0.5
    assert kept(top_p_mask(logits, torch.tensor([0.6]))) == [[0, 1]]
    assert kept(top_p_mask(logits, torch.tensor([0.81]))) == [[0, 1, 2]]
    assert kept(top_p_mask(logits, torch.tensor([1.0]))) == [[0, 1, 2, 3]]
    # order in the vocabulary does not matter
    shuffled = torch.tensor([[0.15, 0.05, 0.5, 0.3]]).log()
    assert kept(top_p_mask(shuffled, torch.tensor([0.6]))) == [[2, 3]]


def test_min_p_drops_tokens_below_fraction_of_the_max():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    # threshold 0.4 * 0.5 = 0.2: keeps 0.5 and 0.3
    assert kept(min_p_mask(logits, torch.tensor([0.4]))) == [[0, 1]]
    assert kept(min_p_mask(logits, torch.tensor([0.0]))) == [[0, 1, 2, 3]]


def test_temperature_zero_is_argmax():
    logits = torch.randn(6, 50)
    out = sample(logits, [SamplingParams(temperature=0)] * 6)
    assert out.tokens.tolist() == logits.argmax(-1).tolist()


def test_greedy_rows_stay_greedy_in_a_mixed_batch():
    logits = torch.randn(4, 50)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.5), SamplingParams(top_k=1),
              SamplingParams(temperature=0)]  # fmt: skip
    out = sample(logits, params)
    for row in (0, 2, 3):
        assert out.tokens[row] == logits[row].argmax()


def test_fixed_seed_reproduces_and_is_independent_of_the_batch():
    logits = torch.randn(3, 1000)
    p = SamplingParams(temperature=1.0, seed=1234)

    def draw(batch_rows):
        gens = [p.make_generator("cpu") for _ in batch_rows]
        outs = []
        for _ in range(5):
            outs.append(sample(logits[batch_rows], [p] * len(batch_rows), gens).tokens.tolist())
        return outs

    first, second = draw([0]), draw([0])
    assert first == second
    # the same seeded request alongside others draws the same tokens
    assert [row[0] for row in draw([0, 1, 2])] == [row[0] for row in first]
    unseeded = [sample(logits[[0]], [SamplingParams(temperature=1.0)]).tokens.item() for _ in range(20)]
    assert len(set(unseeded)) > 1  # the sampler really samples


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log().expand(20000, 3)
    torch.manual_seed(0)
    tokens = sample(logits, [SamplingParams(temperature=1.0)] * 20000).tokens
    freq = torch.bincount(tokens, minlength=3).float() / 20000
    assert torch.allclose(freq, probs, atol=0.02)


def test_top_k_restricts_what_is_sampled():
    logits = torch.tensor([[3.0, 2.9, 2.8, -1.0, 0.0]]).expand(500, 5)
    tokens = sample(logits, [SamplingParams(temperature=2.0, top_k=2)] * 500).tokens
    assert set(tokens.tolist()) == {0, 1}


def test_logprobs_are_log_softmax_of_the_raw_logits():
    logits = torch.randn(2, 30)
    out = sample(logits, [SamplingParams(temperature=0, logprobs=3), SamplingParams(temperature=0)])
    ref = logits.log_softmax(-1)
    entry = out.logprobs[0]
    assert math.isclose(entry["token_logprob"], ref[0].max().item(), rel_tol=1e-5)
    assert entry["top_ids"] == ref[0].topk(3).indices.tolist()
    assert out.logprobs[1] is None


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": -0.1}, {"top_p": 0.0}, {"top_p": 1.5}, {"min_p": -0.2}, {"max_tokens": 0}, {"top_k": -5},
     {"logprobs": -1}],
)  # fmt: skip
def test_invalid_values_are_user_errors(kwargs):
    with pytest.raises(UserError):
        SamplingParams(**kwargs)
