"""The page pool: one preallocated K and one V tensor for every layer, shared by all requests."""

from __future__ import annotations

import torch

from ..core.model_config import ModelConfig


class KVPool:
    """K and V buffers: [layers, num_pages + 1, page_size, kv_heads, head_dim] each (NHD pages, the
    layout FlashInfer, FlashAttention and TensorRT-LLM kernels all read).

    Page `padding_page` (the last one) is never handed to a request: the padding rows of a CUDA-graph
    step write their K and V there, so padding can never touch a live page. `kv_heads` is this
    rank's share of the model's KV heads under tensor parallelism (all of them at --tp 1)."""

    def __init__(
        self,
        config: ModelConfig,
        num_pages: int,
        page_size: int,
        device: torch.device,
        dtype: torch.dtype,
        kv_heads: int | None = None,
    ):
        self.kv_heads = kv_heads or config.num_kv_heads
        shape = (config.num_layers, num_pages + 1, page_size, self.kv_heads, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.num_pages, self.page_size = num_pages, page_size
        self.padding_page = num_pages

    def store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the K and V of T tokens [T, kv_heads, head_dim] at token slots [T], where slot
        = page * page_size + offset in the page."""
        self.k[layer].view(-1, *k.shape[1:])[slots] = k
        self.v[layer].view(-1, *v.shape[1:])[slots] = v

    @staticmethod
    def bytes_per_page(
        config: ModelConfig, page_size: int, dtype: torch.dtype, kv_heads: int | None = None
    ) -> int:
        heads = kv_heads or config.num_kv_heads
        per_token = 2 * config.num_layers * heads * config.head_dim * dtype.itemsize
        return per_token * page_size
