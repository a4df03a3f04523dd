"""The page pool: one preallocated K and one V tensor for every layer, shared by all requests."""

from __future__ import annotations

import torch

from ..core.forward_batch import LayerKV
from ..core.model_config import ModelConfig
from ..kernels.kv_write import store_kv


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
        # Each layer's pages as token slots, made once (a step writes every layer).
        slots = (config.num_layers, (num_pages + 1) * page_size, self.kv_heads, config.head_dim)
        self.layers = [LayerKV(k, v) for k, v in zip(self.k.view(slots), self.v.view(slots), strict=True)]

    def layer_kv(self, layer: int) -> LayerKV:
        return self.layers[layer]

    def store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the K and V of T tokens [T, kv_heads, head_dim] at token slots [T] (int32 or int64),
        where slot = page * page_size + offset in the page: one Triton kernel on a GPU
        (kernels/kv_write.py), torch's index_put elsewhere."""
        dest = self.layers[layer]
        store_kv(dest.k, dest.v, slots, k, v, dest.k_scale, dest.v_scale)

    @staticmethod
    def bytes_per_page(
        config: ModelConfig, page_size: int, dtype: torch.dtype, kv_heads: int | None = None
    ) -> int:
        heads = kv_heads or config.num_kv_heads
        per_token = 2 * config.num_layers * heads * config.head_dim * dtype.itemsize
        return per_token * page_size
