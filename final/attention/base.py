"""The interface every attention backend implements.

A backend owns how attention reads the paged KV pool. Once per step `prepare(batch)` turns the
batch's page-table rows and lengths into whatever its kernel wants (index lists, a plan); then
each layer calls `forward` with the new tokens' q, k, v. Writing k and v into the pool is the
backend's job too, because some kernels do it themselves. CUDA-graph capture will add
`prepare_for_capture` / `prepare_for_replay` here when graphs are ported.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ..core.forward_batch import ForwardBatch
from ..core.model_config import ModelConfig
from ..kvcache import KVPool, PageTable


class AttentionBackend(ABC):
    name = "base"

    def __init__(self, config: ModelConfig, pool: KVPool, page_table: PageTable):
        self.config, self.pool, self.page_table = config, pool, page_table
        self.scale = config.head_dim**-0.5

    @abstractmethod
    def prepare(self, batch: ForwardBatch) -> None:
        """Called once per step, before the forward pass."""

    @abstractmethod
    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """q [T, heads, head_dim], k and v [T, kv_heads, head_dim] of this step's tokens -> [T, heads * head_dim]."""


class HybridBackend(AttentionBackend):
    """One backend for prefill batches and another for decode batches (`--attn fa,fi`)."""

    def __init__(self, prefill: AttentionBackend, decode: AttentionBackend):
        super().__init__(prefill.config, prefill.pool, prefill.page_table)
        self.prefill, self.decode = prefill, decode
        self.name = f"{prefill.name},{decode.name}"

    def _pick(self, batch: ForwardBatch) -> AttentionBackend:
        return self.prefill if batch.is_prefill else self.decode

    def prepare(self, batch: ForwardBatch) -> None:
        self._pick(batch).prepare(batch)

    def forward(self, layer, q, k, v, batch):
        return self._pick(batch).forward(layer, q, k, v, batch)
