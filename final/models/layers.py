"""The building blocks of a decoder layer, shaped for speed and for tensor parallelism at load time.

`MergedColumnLinear` is one matmul where the checkpoint has several: q/k/v become one `qkv_proj`,
gate/up one `gate_up_proj`. Fewer, larger GEMMs keep a GPU busier at small batch sizes (a decode
step is a handful of skinny matmuls per layer), and the weights are merged once, while loading.

Under tensor parallelism (a `TPInfo` of several ranks) each layer holds only its rank's slice and
reads only that slice from the checkpoint (`load_weight`):

    ColumnParallelLinear, MergedColumnLinear   output features split: each rank computes a slice
    RowParallelLinear                          input features split: partial sums, one all-reduce
    VocabParallelEmbedding, ParallelLMHead     vocabulary rows split (padded to a multiple of ranks)

With one rank they are plain Linear / Embedding layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.tp import TPInfo
from ..kernels import gemv
from . import fused


class CheckpointTensor(Protocol):
    """A tensor of the checkpoint, read lazily: `read(dim, start, length)` reads a slice only."""

    shape: tuple[int, ...]

    def read(self, dim: int | None = None, start: int = 0, length: int | None = None) -> torch.Tensor: ...


def _copy(target: torch.Tensor, source: torch.Tensor, what: str) -> None:
    if tuple(target.shape) != tuple(source.shape):
        raise ValueError(f"{what} has shape {tuple(source.shape)}, expected {tuple(target.shape)}")
    target.copy_(source)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused.rms_norm(x, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): the residual add fused into the norm where a kernel
        does both in one pass."""
        return fused.add_rms_norm(x, residual, self.weight, self.eps)


class Linear(nn.Module):
    """y = x W^T (+ b), with the checkpoint's parameter names (`weight`, `bias`); every rank holds
    all of W."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gemv.linear(x, self.weight, self.bias)  # F.linear, or a GEMV at decode sizes

    def _param(self, name: str) -> torch.Tensor:
        target = self.weight if name == "weight" else self.bias
        if target is None:
            raise ValueError(f"{name} given for a layer without one")
        return target

    def load_weight(self, name: str, part: int, tensor: CheckpointTensor) -> None:
        _copy(self._param(name), tensor.read(), name)


class ColumnParallelLinear(Linear):
    """W's output rows split over the ranks: each rank computes its slice of y."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TPInfo):
        super().__init__(in_features, tp.split(out_features, "output features"), bias)
        self.tp, self.full_out = tp, out_features

    def load_weight(self, name: str, part: int, tensor: CheckpointTensor) -> None:
        start, length = self.tp.shard(self.full_out)
        _copy(self._param(name), tensor.read(0, start, length), name)


class MergedColumnLinear(Linear):
    """Several column-parallel layers with the same input, stacked along the output: one matmul.

    The checkpoint still has the parts (q_proj, k_proj, v_proj); `load_weight` copies this rank's
    rows of part i (`part_shards[i]`: first row and row count in the checkpoint's tensor) into its
    place, and the model's forward splits the output back with `output_sizes`."""

    def __init__(self, in_features: int, part_shards: Sequence[tuple[int, int]], bias: bool):
        self.part_shards = list(part_shards)
        self.output_sizes = [length for _, length in self.part_shards]
        super().__init__(in_features, sum(self.output_sizes), bias)
        self.offsets = [sum(self.output_sizes[:i]) for i in range(len(self.output_sizes))]

    @classmethod
    def split_evenly(
        cls, in_features: int, part_sizes: Sequence[int], bias: bool, tp: TPInfo
    ) -> MergedColumnLinear:
        """Each part's output rows split evenly over the ranks (gate/up; q of q/k/v)."""
        return cls(in_features, [tp.shard(size) for size in part_sizes], bias)

    def load_weight(self, name: str, part: int, tensor: CheckpointTensor) -> None:
        target = self._param(name)
        start, length = self.part_shards[part]
        offset = self.offsets[part]
        _copy(target[offset : offset + length], tensor.read(0, start, length), f"{name} part {part}")


class RowParallelLinear(Linear):
    """W's input columns split over the ranks: each rank multiplies its slice of x (the output of a
    column-parallel layer, already split) and one all-reduce sums the partial results."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TPInfo):
        super().__init__(tp.split(in_features, "input features"), out_features, bias)
        self.tp, self.full_in = tp, in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.all_reduce(gemv.linear(x, self.weight))
        return y if self.bias is None else y + self.bias  # the bias once, after the sum

    def load_weight(self, name: str, part: int, tensor: CheckpointTensor) -> None:
        if name == "bias":
            _copy(self._param(name), tensor.read(), name)
            return
        start, length = self.tp.shard(self.full_in)
        _copy(self.weight, tensor.read(1, start, length), name)


class VocabParallelEmbedding(nn.Module):
    """The embedding table, its vocabulary rows split over the ranks (padded to a multiple of them).
    A rank looks up the ids in its slice, zeroes the others, and an all-reduce assembles the rows."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TPInfo):
        super().__init__()
        self.tp, self.vocab_size = tp, vocab_size
        self.start, self.rows = tp.shard(tp.padded_vocab(vocab_size))
        self.weight = nn.Parameter(torch.empty(self.rows, hidden_size), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        outside = (local < 0) | (local >= self.rows)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0)
        return self.tp.all_reduce(out)

    def load_weight(self, name: str, part: int, tensor: CheckpointTensor) -> None:
        # The last rank's slice may run past the real vocabulary: those padding rows stay zero.
        real = max(0, min(self.rows, self.vocab_size - self.start))
        self.weight[real:].zero_()
        if real:
            _copy(self.weight[:real], tensor.read(0, self.start, real), name)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection onto the vocabulary, split like the embedding: each rank computes the
    logits of its slice of the vocabulary, and an all-gather puts them side by side."""

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:  # type: ignore[override]
        """The logits [rows, vocab]; with `out`, written there and returned (straight from the
        matmul on one rank with an unpadded vocabulary, else copied)."""
        if out is not None and self.tp.size == 1 and self.rows == self.vocab_size:
            return gemv.linear(x, self.weight, out=out)
        logits = self.tp.all_gather(gemv.linear(x, self.weight))[..., : self.vocab_size]
        return logits if out is None else out.copy_(logits)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation on the merged gate/up output: silu(gate) * up."""
    return fused.silu_and_mul(gate_up)
