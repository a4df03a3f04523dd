"""The building blocks of a decoder layer, shaped for speed at load time.

`MergedLinear` is one matmul where the checkpoint has several: q/k/v become one `qkv_proj`,
gate/up one `gate_up_proj`. Fewer, larger GEMMs keep a GPU busier at small batch sizes (a decode
step is a handful of skinny matmuls per layer), and the weights are merged once, while loading.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 even for bf16 activations: the mean of squares loses too much in bf16.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Linear(nn.Module):
    """y = x W^T (+ b), with the checkpoint's parameter names (`weight`, `bias`)."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class MergedLinear(Linear):
    """Several linear layers with the same input, stacked along the output: one matmul.

    The checkpoint still has the parts (q_proj, k_proj, v_proj); `load_shard` copies part i into
    its rows, and the model's forward splits the output back with `output_sizes`.
    """

    def __init__(self, in_features: int, output_sizes: Sequence[int], bias: bool):
        super().__init__(in_features, sum(output_sizes), bias)
        self.output_sizes = list(output_sizes)
        self.offsets = [sum(self.output_sizes[:i]) for i in range(len(self.output_sizes))]

    def load_shard(self, param_name: str, shard: int, tensor: torch.Tensor) -> None:
        target = self.weight if param_name == "weight" else self.bias
        if target is None:
            raise ValueError(f"{param_name} given for a MergedLinear without one")
        start, size = self.offsets[shard], self.output_sizes[shard]
        if tensor.shape[0] != size or tuple(tensor.shape[1:]) != tuple(target.shape[1:]):
            raise ValueError(
                f"shard {shard} has shape {tuple(tensor.shape)}, expected ({size}, *{tuple(target.shape[1:])})"
            )
        target[start : start + size].copy_(tensor)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation on the merged gate/up output: silu(gate) * up."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
