"""The page pool: one preallocated K and one V tensor for every layer, shared by all requests."""

from __future__ import annotations

import torch

from ..core.model_config import ModelConfig


class KVPool:
    """K and V buffers: [layers, num_pages, page_size, kv_heads, head_dim] each (NHD pages, the
    layout FlashInfer, FlashAttention and TensorRT-LLM kernels all read)."""

    def __init__(
        self, config: ModelConfig, num_pages: int, page_size: int, device: torch.device, dtype: torch.dtype
    ):
        shape = (config.num_layers, num_pages, page_size, config.num_kv_heads, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.num_pages, self.page_size = num_pages, page_size

    def store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the K and V of T tokens [T, kv_heads, head_dim] at token slots [T], where slot
        = page * page_size + offset in the page."""
        self.k[layer].view(-1, *k.shape[1:])[slots] = k
        self.v[layer].view(-1, *v.shape[1:])[slots] = v

    @staticmethod
    def bytes_per_page(config: ModelConfig, page_size: int, dtype: torch.dtype) -> int:
        per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype.itemsize
        return per_token * page_size
