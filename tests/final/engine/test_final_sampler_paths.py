"""Which draw the sampler takes (engine/sampler.py): the Gumbel-max kernel for a batch drawn with
the temperature alone, FlashInfer's chain when a row filters, the torch reference for a seeded
request. The kernels need a GPU; here they are stand-ins that record their calls, so the choice
itself is tested on the CPU (the kernels' draws: test_final_kernels_interpret.py, on a GPU
test_final_gpu_kernels.py)."""

from __future__ import annotations

import pytest
import torch

from final.core.sampling_params import SamplingParams
from final.engine.sampler import Sampler, make_generator
from final.kernels import sampling as sampling_kernels

VOCAB = 32


@pytest.fixture
def paths(monkeypatch):
    """The GPU paths as recorders: each returns token 0 for every row."""
    calls: list[tuple[str, list[float]]] = []

    def gumbel(logits, rows, temperature, greedy, seed):
        """The kernel's contract: a greedy row (by the table) is its argmax, the others a draw
        (token 0 here); each row's temperature read from the table at its page-table row."""
        assert seed.dtype == torch.int64 and seed.numel() == 1
        calls.append(("gumbel", temperature[rows.long()].tolist()))
        return torch.where(greedy[rows.long()], logits.argmax(dim=-1), 0)

    def argmax(logits):
        calls.append(("argmax", []))
        return logits.argmax(dim=-1)

    def flashinfer(logits, temperature, top_k, top_p, min_p, row_index):
        calls.append(("flashinfer", temperature.tolist()))
        return torch.zeros(logits.shape[0], dtype=torch.long)

    monkeypatch.setattr(sampling_kernels, "gumbel_available", lambda logits: True)
    monkeypatch.setattr(sampling_kernels, "available", lambda logits: True)
    monkeypatch.setattr(sampling_kernels, "triton_sample", gumbel)
    monkeypatch.setattr(sampling_kernels, "triton_argmax", argmax)
    monkeypatch.setattr(sampling_kernels, "flashinfer_sample", flashinfer)
    return calls


def sample(params: list[SamplingParams], seeded: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    sampler = Sampler(8, torch.device("cpu"), VOCAB)
    rows = torch.tensor([5, 2, 7][: len(params)], dtype=torch.int32)
    for row, p in zip(rows.tolist(), params, strict=True):
        sampler.admit(row, p)
    generators = [make_generator(p, torch.device("cpu")) if seeded else None for p in params]
    logits = torch.randn(len(params), VOCAB)
    return sampler.sample(logits, rows, params, generators).tokens, logits


def test_the_temperature_alone_takes_the_gumbel_kernel_with_each_rows_temperature(paths):
    sample([SamplingParams(temperature=0.6), SamplingParams(temperature=1.3)])
    assert paths == [("gumbel", pytest.approx([0.6, 1.3]))]


@pytest.mark.parametrize("flt", [{"top_k": 5}, {"top_p": 0.9}, {"min_p": 0.1}])
def test_a_filter_in_any_row_takes_flashinfers_chain(paths, flt):
    sample([SamplingParams(temperature=0.6), SamplingParams(temperature=0.8, **flt)])
    assert [name for name, _ in paths] == ["flashinfer"]


def test_a_greedy_batch_takes_the_argmax_kernel(paths):
    tokens, logits = sample([SamplingParams(temperature=0), SamplingParams(temperature=0)])
    assert paths == [("argmax", [])] and torch.equal(tokens, logits.argmax(dim=-1))


def test_greedy_rows_keep_their_argmax_beside_the_gumbel_draw(paths):
    torch.manual_seed(4)
    tokens, logits = sample([SamplingParams(temperature=0), SamplingParams(temperature=0.7)])
    assert [name for name, _ in paths] == ["gumbel"]
    assert tokens[0] == logits[0].argmax() != 0, "the greedy row is its argmax, not the draw"
    assert tokens[1] == 0  # the stand-in's draw


def test_a_seeded_request_takes_the_reference(paths):
    sample([SamplingParams(temperature=0.6, seed=3)], seeded=True)
    assert paths == []
