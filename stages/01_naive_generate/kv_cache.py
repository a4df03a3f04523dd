"""The simplest KV cache: one contiguous buffer per request, sized for its whole life up front.

It is what HF transformers does too, and it is why one request at a time is all this stage
can serve well: the buffer reserves prompt + max_tokens slots whether or not they are used,
and two requests of different lengths cannot share a batch without padding.
"""

from __future__ import annotations

import torch

from stages.common.model_config import ModelConfig


class ContiguousKVCache:
    def __init__(self, config: ModelConfig, max_len: int, device: torch.device | str, dtype: torch.dtype):
        shape = (config.num_layers, max_len, config.num_kv_heads, config.head_dim)
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.length = 0  # tokens whose K and V are stored (in every layer)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new tokens' K and V [tokens, kv_heads, head_dim] after the cached ones, and
        return K and V of the whole sequence so far. `advance` moves the length once per step."""
        start, end = self.length, self.length + k.shape[0]
        assert end <= self.max_len, "KV cache overflow: the generate loop must stop before this"
        self.k[layer, start:end] = k
        self.v[layer, start:end] = v
        return self.k[layer, :end], self.v[layer, :end]

    def advance(self, num_tokens: int) -> None:
        self.length += num_tokens
