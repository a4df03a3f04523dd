"""The interface every attention backend implements.

A backend owns how attention reads the paged KV pool. Once per step `prepare(batch)` turns the
batch's page-table rows and lengths into whatever its kernel wants (index lists, a plan); then
each layer calls `forward` with the new tokens' q, k, v. Writing k and v into the pool is the
backend's job too (`write_kv`), unless the model wrote them already with its fused norm + RoPE +
write kernel: it then passes k and v as None, having asked `layer_kv` where they go.

CUDA-graph decode (engine/graph.py) captures `forward` once per batch size and replays it: the
metadata a captured kernel reads must then live in buffers whose addresses never change, and
every shape must be fixed. `prepare_for_capture(batch)` sets those up for a padded batch of a
captured size, and `prepare_for_replay(batch)` refills them before each replay. A backend that
cannot say `graph_unsupported_reason(max_batch) is None` runs its decode steps eagerly. A backend
whose decode kernel depends on more than the batch size (FlashInfer's: on tensor cores for long
contexts) names its kernels per size in `graph_variants(size)`, one graph each, and says which one a
step replays (`graph_variant(batch)`); the two prepare calls then take that variant.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ..core.forward_batch import ForwardBatch, LayerKV
from ..core.model_config import ModelConfig
from ..kvcache.page_table import PageTable
from ..kvcache.pool import KVPool
from .spec import Library


class AttentionBackend(ABC):
    name = "base"

    def __init__(
        self,
        config: ModelConfig,
        pool: KVPool,
        page_table: PageTable,
        num_heads: int | None = None,
        library: Library | None = None,  # the kernel library support.py chose (None: needs none)
    ):
        self.config, self.pool, self.page_table = config, pool, page_table
        # Query heads on this rank (all of them without tensor parallelism); KV heads: pool.kv_heads.
        self.num_heads = num_heads or config.num_heads
        self.scale = config.head_dim**-0.5

    @abstractmethod
    def prepare(self, batch: ForwardBatch) -> None:
        """Called once per step, before the forward pass."""

    @abstractmethod
    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        batch: ForwardBatch,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q [T, heads, head_dim], k and v [T, kv_heads, head_dim] of this step's tokens (None:
        already in the pool) -> [T, heads * head_dim]. `out` [T, heads, head_dim_v], contiguous: a
        buffer the result may be written into (the piecewise prefill's static one); a backend whose
        kernel cannot write there returns its own tensor, and the caller copies."""

    def layer_kv(self, layer: int) -> LayerKV:
        """Where layer `layer`'s K and V live: for a model that writes them itself."""
        return self.pool.layer_kv(layer)

    def write_kv(
        self, layer: int, k: torch.Tensor | None, v: torch.Tensor | None, batch: ForwardBatch
    ) -> None:
        """The step's K and V into the pool at the batch's slots, unless the model wrote them."""
        if k is not None and v is not None:
            self.pool.store(layer, batch.out_slots, k, v)

    def graph_unsupported_reason(self, max_batch: int) -> str | None:
        """Why decode steps of up to `max_batch` rows cannot be captured (None: they can)."""
        return f"the {self.name} backend has no capturable decode step"

    def graph_variants(self, size: int) -> tuple[object, ...]:
        """The decode kernels a step of `size` rows may run, one graph each: one for most backends."""
        return (None,)

    def graph_variant(self, batch: ForwardBatch) -> object:
        """Which of graph_variants(batch.size) this (padded) decode step replays."""
        return None

    def prepare_for_capture(self, batch: ForwardBatch, variant: object = None) -> None:
        """Before capturing a decode step of `batch.size` rows (a captured size, padding included),
        with the kernel of `variant` (None: the one `graph_variant(batch)` picks)."""
        raise NotImplementedError(self.graph_unsupported_reason(batch.size))

    def prepare_for_replay(self, batch: ForwardBatch, variant: object = None) -> None:
        """Before replaying the decode graph of `batch.size` rows and `variant` (as above)."""
        raise NotImplementedError(self.graph_unsupported_reason(batch.size))


class HybridBackend(AttentionBackend):
    """One backend for prefill batches and another for decode batches (`--attn fa,fi`)."""

    def __init__(self, prefill: AttentionBackend, decode: AttentionBackend):
        super().__init__(prefill.config, prefill.pool, prefill.page_table, prefill.num_heads)
        self.prefill, self.decode = prefill, decode
        self.name = f"{prefill.name},{decode.name}"

    def _pick(self, batch: ForwardBatch) -> AttentionBackend:
        return self.prefill if batch.is_prefill else self.decode

    def prepare(self, batch: ForwardBatch) -> None:
        self._pick(batch).prepare(batch)

    def graph_unsupported_reason(self, max_batch: int) -> str | None:
        return self.decode.graph_unsupported_reason(max_batch)  # only decode steps are captured

    def graph_variants(self, size: int) -> tuple[object, ...]:
        return self.decode.graph_variants(size)

    def graph_variant(self, batch: ForwardBatch) -> object:
        return self.decode.graph_variant(batch)

    def prepare_for_capture(self, batch: ForwardBatch, variant: object = None) -> None:
        self.decode.prepare_for_capture(batch, variant)

    def prepare_for_replay(self, batch: ForwardBatch, variant: object = None) -> None:
        self.decode.prepare_for_replay(batch, variant)

    def forward(self, layer, q, k, v, batch, out=None):
        return self._pick(batch).forward(layer, q, k, v, batch, out)
