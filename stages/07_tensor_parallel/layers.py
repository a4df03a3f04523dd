"""The layers of a sharded decoder. Each holds its rank's slice of a weight and says which slice
that is (`read_shard`), so the loader reads only that slice from the checkpoint.

    ColumnParallelLinear    W's output rows split: each rank computes a slice of y; no communication
    RowParallelLinear       W's input columns split: each rank a partial y; one all-reduce sums them
    VocabParallelEmbedding  the vocabulary's rows split (padded to a multiple of the ranks); one all-reduce
    ParallelLMHead          the same rows as the output projection; the logits' slices gathered

A column-parallel layer feeding a row-parallel one needs nothing between them: the row-parallel
layer's input is split exactly as the column-parallel layer's output is (Megatron-LM's pattern).
So attention (q/k/v, then o_proj) and the MLP (gate/up, then down_proj) cost one all-reduce each.
With one rank these are plain Linear and Embedding layers.

`read_shard(name, tensor)` gets a safetensors slice: indexing it reads only those bytes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .distributed import TPInfo


# --8<-- [start:linear]
class ColumnParallelLinear(nn.Linear):
    """y = x W^T with W's output rows split: this rank computes y's columns start..start+length.
    `rows` picks another slice than the even split (the KV heads when they are replicated)."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool, tp: TPInfo, rows: tuple[int, int] | None = None
    ):
        start, length = rows or tp.shard(out_features, "output features")
        super().__init__(in_features, length, bias=bias)
        self.start = start

    def read_shard(self, name: str, tensor) -> torch.Tensor:
        return tensor[self.start : self.start + self.out_features]  # the weight's rows, the bias's entries


class RowParallelLinear(nn.Linear):
    """y = x W^T with W's input columns split: x arrives split the same way (the output of a
    column-parallel layer), each rank computes a partial y, and an all-reduce sums them."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TPInfo):
        start, length = tp.shard(in_features, "input features")
        super().__init__(length, out_features, bias=bias)
        self.start, self.tp = start, tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias  # once, after the sum

    def read_shard(self, name: str, tensor) -> torch.Tensor:
        if name == "bias":
            return tensor[:]
        return tensor[:, self.start : self.start + self.in_features]


# --8<-- [end:linear]


# --8<-- [start:vocab]
class VocabParallelEmbedding(nn.Module):
    """The embedding table with its rows (the vocabulary) split. A rank looks up the ids in its
    slice and leaves zeros for the rest; an all-reduce adds the ranks' rows up."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TPInfo):
        super().__init__()
        self.tp, self.vocab_size = tp, vocab_size
        self.start, self.rows = tp.shard(tp.padded_vocab(vocab_size), "vocabulary rows")
        self.weight = nn.Parameter(torch.empty(self.rows, hidden_size))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        outside = (local < 0) | (local >= self.rows)
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(x.masked_fill(outside.unsqueeze(-1), 0))

    def read_shard(self, name: str, tensor) -> torch.Tensor:
        # The last rank's slice may run past the real vocabulary: those padding rows are zeros.
        real = max(0, min(self.rows, self.vocab_size - self.start))
        return F.pad(tensor[self.start : self.start + real], (0, 0, 0, self.rows - real))


class ParallelLMHead(VocabParallelEmbedding):
    """The projection onto the vocabulary, split like the embedding (and tied to it where the model
    ties them): each rank computes the logits of its slice, an all-gather puts them side by side,
    and the padding columns are cut off."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.tp.all_gather(F.linear(x, self.weight))[:, : self.vocab_size]


# --8<-- [end:vocab]
