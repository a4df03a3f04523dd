"""The interface every attention backend implements.

A backend owns how attention reads the paged KV pool. Once per step `prepare(batch)` turns the
batch's page tables and lengths into whatever the kernel wants (index lists, a plan); then the
model calls `forward` once per layer with the new tokens' q, k, v. Writing k and v into the pool
is the backend's job too, because some kernels want to do it themselves.

A CUDA graph (graph.py) records one decode step per batch size and replays it: whatever a
recorded kernel reads must then sit at a fixed address, in a fixed shape. A backend that can do
that says so (`graph_unsupported_reason` returns None), sets its fixed buffers up in
`prepare_for_capture`, and refills them in `prepare_for_replay`, before every replay.
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

    # --8<-- [start:graph_hooks]
    def graph_unsupported_reason(self, max_batch: int) -> str | None:
        """Why decode steps of up to `max_batch` rows cannot be captured (None: they can)."""
        return f"{type(self).__name__} has no capturable decode step"

    def prepare_for_capture(self, batch: Batch) -> None:
        """Before recording the decode step of a static batch (every row a padding row)."""
        raise NotImplementedError(self.graph_unsupported_reason(len(batch.seq_lens)))

    def prepare_for_replay(self, batch: Batch) -> None:
        """Before replaying the decode step of a static batch: the step's lengths, padding included."""
        raise NotImplementedError(self.graph_unsupported_reason(len(batch.seq_lens)))

    # --8<-- [end:graph_hooks]


class HybridBackend(AttentionBackend):
    """One backend for prefill batches and another for decode batches (`--attn fa,fi`)."""

    def __init__(self, prefill: AttentionBackend, decode: AttentionBackend):
        super().__init__(prefill.config, prefill.pool, prefill.page_table)
        self.prefill, self.decode = prefill, decode

    def _pick(self, batch: Batch) -> AttentionBackend:
        return self.prefill if batch.is_prefill else self.decode

    def prepare(self, batch: Batch) -> None:
        self._pick(batch).prepare(batch)

    # Only decode steps are captured: the graph hooks are the decode backend's.
    def graph_unsupported_reason(self, max_batch: int) -> str | None:
        return self.decode.graph_unsupported_reason(max_batch)

    def prepare_for_capture(self, batch: Batch) -> None:
        self.decode.prepare_for_capture(batch)

    def prepare_for_replay(self, batch: Batch) -> None:
        self.decode.prepare_for_replay(batch)

    def forward(self, layer, q, k, v, batch):
        return self._pick(batch).forward(layer, q, k, v, batch)
