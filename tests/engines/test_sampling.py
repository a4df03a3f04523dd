"""Sampling: the masks against hand-computed cases, seeds, greedy, and parameter validation, over
both samplers: the stages' (stages/common/sampling.py) and final's (final/engine/sampler.py),
which keeps its parameters in per-row device tensors."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import final.core.errors
import final.core.sampling_params
import final.engine.sampler
import stages.common.errors
import stages.common.sampling

NEG = float("-inf")


def _stages_impl() -> SimpleNamespace:
    mod = stages.common.sampling
    return SimpleNamespace(
        name="stages",
        Params=mod.SamplingParams,
        UserError=stages.common.errors.UserError,
        sample=mod.sample,
        top_k_mask=mod.top_k_mask,
        top_p_mask=mod.top_p_mask,
        min_p_mask=mod.min_p_mask,
        generator=lambda p: p.make_generator("cpu"),
        logprobs=lambda out: out.logprobs,
    )


def _final_impl() -> SimpleNamespace:
    mod = final.engine.sampler
    return SimpleNamespace(
        name="final",
        Params=final.core.sampling_params.SamplingParams,
        UserError=final.core.errors.UserError,
        sample=mod.sample,
        top_k_mask=mod.top_k_mask,
        top_p_mask=mod.top_p_mask,
        min_p_mask=mod.min_p_mask,
        generator=lambda p: mod.make_generator(p, torch.device("cpu")),
        logprobs=lambda out: out.logprobs.entries() if out.logprobs is not None else [None] * len(out.tokens),
    )


@pytest.fixture(params=["stages", "final"])
def impl(request) -> SimpleNamespace:
    return _stages_impl() if request.param == "stages" else _final_impl()


def kept(masked: torch.Tensor) -> list[list[int]]:
    return [torch.nonzero(row != NEG).flatten().tolist() for row in masked]


def test_top_k_keeps_the_k_largest_per_row(impl):
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0], [9.0, 1.0, 2.0, 0.0]])
    assert kept(impl.top_k_mask(logits, torch.tensor([2, 1]))) == [[1, 3], [0]]
    # k <= 0 means no limit
    assert kept(impl.top_k_mask(logits, torch.tensor([-1, 0]))) == [[0, 1, 2, 3], [0, 1, 2, 3]]


def test_final_top_k_with_a_partial_sort_equals_the_full_sort():
    """final's top-k ranks only the batch's largest k when it is known: the same mask."""
    torch.manual_seed(1)
    logits = torch.randn(6, 300)
    k = torch.tensor([1, 5, 17, 5, 2, 40])
    full = final.engine.sampler.top_k_mask(logits, k)
    assert torch.equal(final.engine.sampler.top_k_mask(logits, k, max_k=40), full)
    assert kept(full)[2] == sorted(logits[2].topk(17).indices.tolist())


def test_top_p_keeps_smallest_set_reaching_p(impl):
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    assert kept(impl.top_p_mask(logits, torch.tensor([0.5]))) == [[0]]  # 0.5 already reaches 0.5
    assert kept(impl.top_p_mask(logits, torch.tensor([0.6]))) == [[0, 1]]
    assert kept(impl.top_p_mask(logits, torch.tensor([0.81]))) == [[0, 1, 2]]
    assert kept(impl.top_p_mask(logits, torch.tensor([1.0]))) == [[0, 1, 2, 3]]
    # order in the vocabulary does not matter
    shuffled = torch.tensor([[0.15, 0.05, 0.5, 0.3]]).log()
    assert kept(impl.top_p_mask(shuffled, torch.tensor([0.6]))) == [[2, 3]]


def test_min_p_drops_tokens_below_fraction_of_the_max(impl):
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    # threshold 0.4 * 0.5 = 0.2: keeps 0.5 and 0.3
    assert kept(impl.min_p_mask(logits, torch.tensor([0.4]))) == [[0, 1]]
    assert kept(impl.min_p_mask(logits, torch.tensor([0.0]))) == [[0, 1, 2, 3]]


def test_temperature_zero_is_argmax(impl):
    logits = torch.randn(6, 50)
    out = impl.sample(logits, [impl.Params(temperature=0)] * 6)
    assert out.tokens.tolist() == logits.argmax(-1).tolist()


def test_greedy_rows_stay_greedy_in_a_mixed_batch(impl):
    logits = torch.randn(4, 50)
    params = [
        impl.Params(temperature=0),
        impl.Params(temperature=1.5),
        impl.Params(top_k=1),
        impl.Params(temperature=0),
    ]
    out = impl.sample(logits, params)
    for row in (0, 2, 3):
        assert out.tokens[row] == logits[row].argmax()


def test_fixed_seed_reproduces_and_is_independent_of_the_batch(impl):
    logits = torch.randn(3, 1000)
    p = impl.Params(temperature=1.0, seed=1234)

    def draw(batch_rows):
        gens = [impl.generator(p) for _ in batch_rows]
        outs = []
        for _ in range(5):
            outs.append(impl.sample(logits[batch_rows], [p] * len(batch_rows), gens).tokens.tolist())
        return outs

    first, second = draw([0]), draw([0])
    assert first == second
    # the same seeded request alongside others draws the same tokens
    assert [row[0] for row in draw([0, 1, 2])] == [row[0] for row in first]
    unseeded = [impl.sample(logits[[0]], [impl.Params(temperature=1.0)]).tokens.item() for _ in range(20)]
    assert len(set(unseeded)) > 1  # the sampler really samples


def test_sampling_follows_the_distribution(impl):
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log().expand(20000, 3)
    torch.manual_seed(0)
    tokens = impl.sample(logits, [impl.Params(temperature=1.0)] * 20000).tokens
    freq = torch.bincount(tokens, minlength=3).float() / 20000
    assert torch.allclose(freq, probs, atol=0.02)


def test_top_k_restricts_what_is_sampled(impl):
    logits = torch.tensor([[3.0, 2.9, 2.8, -1.0, 0.0]]).expand(500, 5)
    tokens = impl.sample(logits, [impl.Params(temperature=2.0, top_k=2)] * 500).tokens
    assert set(tokens.tolist()) == {0, 1}


def test_top_p_and_min_p_restrict_what_is_sampled(impl):
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().expand(500, 4)
    tokens = impl.sample(logits, [impl.Params(temperature=1.0, top_p=0.6)] * 500).tokens
    assert set(tokens.tolist()) == {0, 1}
    tokens = impl.sample(logits, [impl.Params(temperature=1.0, min_p=0.5)] * 500).tokens
    assert set(tokens.tolist()) == {0, 1}


def test_final_reads_parameters_from_the_rows_it_is_given():
    """final's sampler gathers each request's parameters by its page-table row: rows out of order,
    and a row left over from an earlier request, must not leak into the draw."""
    sampler = final.engine.sampler.Sampler(4, torch.device("cpu"), vocab_size=100)
    Params = final.core.sampling_params.SamplingParams
    sampler.admit(3, Params(temperature=0))  # greedy
    sampler.admit(1, Params(temperature=1.0, top_k=1))  # greedy through top-k
    sampler.admit(0, Params(temperature=5.0))  # an earlier request's row, not used below
    logits = torch.randn(2, 100)
    params = [Params(temperature=0), Params(temperature=1.0, top_k=1)]
    out = sampler.sample(logits, torch.tensor([3, 1]), params, [None, None])
    assert out.tokens.tolist() == logits.argmax(-1).tolist()
    sampler.admit(2, Params(temperature=2.0, top_k=2))
    many = torch.tensor([[3.0, 2.9, -9.0, -9.0, 2.8]]).expand(300, 5)
    tokens = sampler.sample(
        many, torch.full((300,), 2), [Params(temperature=2.0, top_k=2)] * 300, [None] * 300
    )
    assert set(tokens.tokens.tolist()) == {0, 1}


def test_final_tiny_temperature_is_greedy_not_garbage():
    logits = torch.randn(3, 50)
    Params = final.core.sampling_params.SamplingParams
    out = final.engine.sampler.sample(
        logits, [Params(temperature=1e-300), Params(temperature=1e-30), Params()]
    )
    assert out.tokens[:2].tolist() == logits[:2].argmax(-1).tolist()


def test_logprobs_are_log_softmax_of_the_raw_logits(impl):
    logits = torch.randn(2, 30)
    out = impl.sample(logits, [impl.Params(temperature=0, logprobs=3), impl.Params(temperature=0)])
    ref = logits.log_softmax(-1)
    entry = impl.logprobs(out)[0]
    assert math.isclose(entry["token_logprob"], ref[0].max().item(), rel_tol=1e-5)
    assert entry["top_ids"] == ref[0].topk(3).indices.tolist()
    assert impl.logprobs(out)[1] is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"min_p": -0.2},
        {"max_tokens": 0},
        {"top_k": -5},
        {"logprobs": -1},
    ],
)
def test_invalid_values_are_user_errors(impl, kwargs):
    with pytest.raises(impl.UserError):
        impl.Params(**kwargs)


# ------------------------------------------------- final's FlashInfer path, FlashInfer stood in


class FakeFlashInferSampling:
    """flashinfer.sampling's functions as its documentation describes them, in torch, recording
    which were called: the sampler's chain of them is checked on the CPU; the kernels themselves
    on a GPU (tests/final/kernels/test_final_gpu_kernels.py)."""

    def __init__(self):
        self.calls: list[str] = []
        mod = final.engine.sampler
        self.keep_top_k = lambda p, k: mod.top_k_mask(p.log(), k).softmax(-1)
        self.keep_top_p = lambda p, top_p: mod.top_p_mask(p.log(), top_p).softmax(-1)
        self.keep_min_p = lambda p, min_p: mod.min_p_mask(p.log(), min_p).softmax(-1)

    def _draw(self, name: str, probs: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        self.calls.append(name)
        return torch.multinomial(probs, 1).squeeze(-1).to(indices.dtype)

    def softmax(self, logits, temperature):
        self.calls.append("softmax")
        assert temperature.dtype == torch.float32 and temperature.shape == logits.shape[:1]
        return (logits.float() / temperature.unsqueeze(-1)).softmax(-1)

    def top_k_renorm_probs(self, probs, top_k):
        self.calls.append("top_k_renorm_probs")
        return self.keep_top_k(probs, top_k)

    def top_p_renorm_probs(self, probs, top_p):
        self.calls.append("top_p_renorm_probs")
        return self.keep_top_p(probs, top_p)

    def top_k_sampling_from_probs(self, probs, top_k, indices):
        return self._draw("top_k_sampling_from_probs", self.keep_top_k(probs, top_k), indices)

    def top_p_sampling_from_probs(self, probs, top_p, indices):
        return self._draw("top_p_sampling_from_probs", self.keep_top_p(probs, top_p), indices)

    def min_p_sampling_from_probs(self, probs, min_p, indices):
        return self._draw("min_p_sampling_from_probs", self.keep_min_p(probs, min_p), indices)

    def sampling_from_probs(self, probs, indices):
        return self._draw("sampling_from_probs", probs, indices)


@pytest.fixture
def fake_flashinfer(monkeypatch):
    from final.kernels import sampling as kernels

    fake = FakeFlashInferSampling()
    monkeypatch.setattr(kernels, "_flashinfer_sampling", lambda: fake)
    monkeypatch.setattr(kernels, "available", lambda logits: True)
    return fake


def reference_distribution(logits: torch.Tensor, p) -> torch.Tensor:
    """The distribution the reference sampler draws from for one row: its masks, its softmax."""
    mod = final.engine.sampler
    scaled = logits.float() / p.temperature
    if p.top_k > 0:
        scaled = mod.top_k_mask(scaled.unsqueeze(0), torch.tensor([p.top_k]))[0]
    scaled = mod.top_p_mask(scaled.unsqueeze(0), torch.tensor([p.top_p]))[0]
    return mod.min_p_mask(scaled.unsqueeze(0), torch.tensor([p.min_p]))[0].softmax(-1)


@pytest.mark.parametrize(
    "kwargs, chain",
    [
        ({}, ["softmax", "sampling_from_probs"]),
        (
            {"top_k": 3},
            ["softmax", "top_k_renorm_probs", "sampling_from_probs"],
        ),  # not top_k_sampling: see _filters
        ({"top_p": 0.7}, ["softmax", "top_p_sampling_from_probs"]),
        ({"min_p": 0.2}, ["softmax", "min_p_sampling_from_probs"]),
        ({"top_k": 4, "top_p": 0.8}, ["softmax", "top_k_renorm_probs", "top_p_sampling_from_probs"]),
        ({"top_k": 4, "min_p": 0.3}, ["softmax", "top_k_renorm_probs", "min_p_sampling_from_probs"]),
        (
            {"top_k": 5, "top_p": 0.9, "min_p": 0.1},
            ["softmax", "top_k_renorm_probs", "top_p_renorm_probs", "min_p_sampling_from_probs"],
        ),
    ],
)
def test_final_flashinfer_chain_samples_the_reference_distribution(fake_flashinfer, kwargs, chain):
    """The FlashInfer path's filters in the reference's order (renorm, then the next filter) draw
    from the distribution the reference's masks define."""
    Params = final.core.sampling_params.SamplingParams
    torch.manual_seed(5)
    logits = torch.randn(12).to(torch.bfloat16) * 2  # the model's dtype, as the sampler gets it
    p = Params(temperature=0.7, **kwargs)
    n = 20000
    out = final.engine.sampler.sample(logits.expand(n, 12), [p] * n)
    assert fake_flashinfer.calls == chain
    assert out.tokens.dtype == torch.int64
    freq = torch.bincount(out.tokens, minlength=12).float() / n
    torch.testing.assert_close(freq, reference_distribution(logits, p), atol=0.015, rtol=0)


def test_final_flashinfer_path_keeps_greedy_rows_and_seeded_requests(fake_flashinfer):
    Params = final.core.sampling_params.SamplingParams
    logits = torch.randn(4, 30)
    params = [
        Params(temperature=0),
        Params(temperature=0.8),
        Params(top_k=1),
        Params(temperature=0.8, top_p=0.5),
    ]
    out = final.engine.sampler.sample(logits, params)
    assert [out.tokens[i].item() for i in (0, 2)] == [logits[0].argmax().item(), logits[2].argmax().item()]
    assert fake_flashinfer.calls == ["softmax", "top_p_sampling_from_probs"]
    fake_flashinfer.calls.clear()
    assert (
        final.engine.sampler.sample(logits, [Params(temperature=0)] * 4).tokens.tolist()
        == logits.argmax(-1).tolist()
    )
    assert fake_flashinfer.calls == []  # all greedy: an argmax, no sampling kernel
    seeded = Params(temperature=0.8, seed=7)
    gens = [final.engine.sampler.make_generator(seeded, torch.device("cpu")) for _ in range(4)]
    final.engine.sampler.sample(logits, [seeded] * 4, gens)
    assert fake_flashinfer.calls == []  # a request with its own seed takes the reference path


def test_a_top_p_that_float32_rounds_to_zero_still_keeps_the_likeliest_token(impl):
    """top_p=1e-300 passes validation (it is above 0) and is 0.0 in a float32 tensor: the mask must
    keep the most likely token, not drop every one (a softmax over all -inf is NaN)."""
    logits = torch.tensor([[0.1, 2.0, -1.0, 0.5]])
    assert kept(impl.top_p_mask(logits, torch.tensor([1e-300], dtype=torch.float32))) == [[1]]
    out = impl.sample(logits.expand(8, 4), [impl.Params(temperature=1.0, top_p=1e-300)] * 8)
    assert out.tokens.tolist() == [1] * 8
