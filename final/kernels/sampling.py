"""Sampling through FlashInfer's kernels, with every row's parameters in device tensors.

The torch reference (engine/sampler.py) sorts the vocabulary for top-p, takes a top-k, builds
masks and an exponential race: a dozen kernels over [rows, vocab] floats. FlashInfer samples by
rejection (https://flashinfer.ai/2025/03/10/sampling.html): each round draws from the row as it
is and raises a probability floor until the draw lands inside the filter, so nothing is sorted.
The chain, in the reference's order:

    probs = softmax(logits / temperature)      flashinfer.sampling.softmax, a temperature per row
    top-k                                      top_k_renorm_probs (then sampling_from_probs if last)
    top-p                                      top_p_renorm_probs, or top_p_sampling_from_probs last
    min-p                                      min_p_sampling_from_probs (always last)
    none of them                               sampling_from_probs

A renorm keeps a filter's survivors and rescales them to sum to one: what the reference's masked
softmax does before the next filter. Min-p compares each probability with the largest one, a
ratio that renormalizing does not change, so it can come last. Each function takes per-row
tensors (temperature float32, top_k int32, top_p and min_p float32); a top_k at or above the
vocabulary keeps every token. The tokens come back as int64, the dtype of the `indices` passed
to the last call (FlashInfer's own output would be int32 and need a cast).

FlashInfer 0.7.2's sampling functions turn bf16 logits into float32 themselves (`logits.float()`
inside `softmax`); nothing else here copies the logits. Random numbers come from torch's default
CUDA generator (FlashInfer advances its Philox offset): a request with its own seed needs the
reference path, because FlashInfer's draw for a row depends on the row's position in the batch.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch


@functools.cache
def _flashinfer_sampling() -> ModuleType | None:
    try:
        import flashinfer.sampling
    except ImportError:
        return None
    return flashinfer.sampling


def available(logits: torch.Tensor) -> bool:
    """Whether FlashInfer can sample these logits (CUDA, FlashInfer installed)."""
    return logits.is_cuda and _flashinfer_sampling() is not None


def flashinfer_sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    row_index: torch.Tensor,
) -> torch.Tensor:
    """One token per row of `logits` [S, vocab]; the parameters are [S] tensors, None where no
    row of the batch uses that filter; `row_index` is arange(S) as int64 (the output's dtype)."""
    fi = _flashinfer_sampling()
    assert fi is not None, "check available() first"
    probs = fi.softmax(logits.contiguous(), temperature)  # a vocabulary-padded TP slice is a strided view
    active = [
        (renorm, sample, value)
        for (renorm, sample), value in zip(_filters(fi), (top_k, top_p, min_p), strict=True)
        if value is not None
    ]
    for renorm, _, value in active[:-1]:  # min-p, when present, is last: it needs no renorm
        probs = renorm(probs, value)
    if not active:
        return fi.sampling_from_probs(probs, indices=row_index)
    renorm, sample, value = active[-1]
    if sample is None:  # top-k last: renormalize, then draw from what is left
        return fi.sampling_from_probs(renorm(probs, value), indices=row_index)
    return sample(probs, value, indices=row_index)


def _filters(fi: ModuleType) -> tuple[tuple, tuple, tuple]:
    """(renorm, sample) per filter, in the reference's order: top-k, top-p, min-p."""
    # No top_k_sampling_from_probs: on an H200 (FlashInfer 0.7.2.post1, 2026-11-25) it drew tokens
    # outside the top k (tests/final/kernels/test_final_gpu_kernels.py, top_k=5 alone: several percent of the
    # draws), while top_k_renorm_probs followed by a plain draw keeps to them.
    return (
        (fi.top_k_renorm_probs, None),
        (fi.top_p_renorm_probs, fi.top_p_sampling_from_probs),
        (None, fi.min_p_sampling_from_probs),
    )
