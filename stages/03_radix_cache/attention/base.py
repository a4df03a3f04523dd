"""The interface every attention backend implements.

A backend owns how attention reads the paged KV pool. Once per step `prepare(batch)` turns the
batch's page tables and lengths into whatever the kernel wants (index lists, a plan); then the
model calls `forward` once per layer with the new tokens' q, k, v. Writing k and v into the pool
is the backend's job too, because some kernels want to do it themselves.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from stages.common.model_config import ModelConfig

from ..kv_cache import KVPool
from ..page_table import PageTable
from ..request import Batch


class AttentionBackend(ABC):
    def __init__(self, config: ModelConfig, pool: KVPool, page_table: PageTable):
        self.config, self.pool, self.page_table = config, pool, page_table

    @abstractmethod
    def prepare(self, batch: Batch) -> None:
        """Called once per step, before the forward pass."""

    @abstractmethod
    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: Batch
    ) -> torch.Tensor:
        """q [T, heads, head_dim], k and v [T, kv_heads, head_dim] of this step's tokens -> [T, heads * head_dim]."""


class HybridBackend(AttentionBackend):
    """One backend for prefill batches and another for decode batches (`--attn fa,fi`)."""

    def __init__(self, prefill: AttentionBackend, decode: AttentionBackend):
        super().__init__(prefill.config, prefill.pool, prefill.page_table)
        self.prefill, self.decode = prefill, decode

    def _pick(self, batch: Batch) -> AttentionBackend:
        return self.prefill if batch.is_prefill else self.decode

    def prepare(self, batch: Batch) -> None:
        self._pick(batch).prepare(batch)

    def forward(self, layer, q, k, v, batch):
        return self._pick(batch).forward(layer, q, k, v, batch)
