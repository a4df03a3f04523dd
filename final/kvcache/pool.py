"""The page pool: one preallocated K and one V tensor for every layer, shared by all requests.

The pool may store K and V narrower than the model computes (--kv-cache-dtype fp8_e4m3): each
layer then has a scale for K and one for V, and holds x / scale in float8_e4m3fn (kernels/
kv_write.py quantizes; the attention backends multiply the scale back in). The scales come from
the checkpoint when it has them (`k_scale`/`v_scale` tensors, as FP8 checkpoints for vLLM and
SGLang carry: models/kv_scales.py), else 1.0, their default too. Why not calibrate on the first
prefill (a layer's largest |x| over 448): measured on the default model against 1.0
(scripts/kv_fp8_accuracy.py --scales calibrated; the table in docs/serving/kv_fp8.md), it agreed
no more often and moved log-probabilities as much, since K and V sit well inside E4M3's range and
what FP8 loses is its 3 mantissa bits; it would tie every scale to one prompt, and a V scale
other than 1.0 costs FlashInfer a kernel per layer (it multiplies the output afterwards).
Scales are fixed when the pool is made: a K written with one scale and read with another would
be wrong, so no scale may change once anything is stored (and CUDA graphs bake them in).
"""

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
        compute_dtype: torch.dtype | None = None,
        scales: tuple[list[float], list[float]] | None = None,
    ):
        """`dtype`: what the pool stores; `compute_dtype`: the activations' (default: the same);
        `scales`: per layer, K's and V's, for an FP8 pool (default, and for any other pool: 1.0)."""
        self.kv_heads = kv_heads or config.num_kv_heads
        shape = (config.num_layers, num_pages + 1, page_size, self.kv_heads, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.dtype, self.compute_dtype = dtype, compute_dtype or dtype
        self.num_pages, self.page_size = num_pages, page_size
        self.padding_page = num_pages
        ones = [1.0] * config.num_layers
        self.k_scales, self.v_scales = scales if scales is not None and self.is_fp8 else (ones, ones)
        # Each layer's pages as token slots, made once (a step writes every layer).
        slots = (config.num_layers, (num_pages + 1) * page_size, self.kv_heads, config.head_dim)
        self.layers = [
            LayerKV(k, v, k_scale, v_scale)
            for k, v, k_scale, v_scale in zip(
                self.k.view(slots), self.v.view(slots), self.k_scales, self.v_scales, strict=True
            )
        ]

    @property
    def is_fp8(self) -> bool:
        """Whether the pool stores x / scale in FP8 (the kernels must multiply the scales back in)."""
        return self.dtype == torch.float8_e4m3fn

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
        """The bytes of one page of K and V over every layer, stored as `dtype` (the pool's)."""
        heads = kv_heads or config.num_kv_heads
        per_token = 2 * config.num_layers * heads * config.head_dim * dtype.itemsize
        return per_token * page_size
