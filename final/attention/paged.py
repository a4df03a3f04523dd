"""What the FlashAttention and TRT-LLM kernels read: a block table, per-request lengths, and for
prefill the cumulative query and key lengths. Both backends build it here, once per step.

Request i of a step computes its last `query_lens[i]` tokens of `seq_lens[i]`: a cached prefix
(a radix hit, or the chunks of its prompt computed in earlier steps) comes first. The kernels
take the queries as the *last* tokens of the sequence (causal masking aligned to the bottom
right), so query j of request i sees keys 0 .. seq_lens[i] - query_lens[i] + j.

    block_table   [B, W] int32  row i: request i's pages, in order (its page-table row's first
                                W columns; W covers the longest request, columns past a
                                request's last page are never read)
    seq_lens      [B] int32     keys per request, this step's tokens included
    cu_seqlens_q  [B + 1] int32 request i's queries are rows cu_seqlens_q[i] : cu_seqlens_q[i+1]
    cu_seqlens_k  [B + 1] int32 the same prefix sum over seq_lens (TRT-LLM and FA2 prefill)

Under CUDA graphs the block table is a fixed buffer, one row per captured row, the page table's
full width; `prepare_for_replay` copies the rows' pages into it, and the lengths are the runner's
static `seq_lens` buffer itself. Decode needs no cumulative lengths (one query per request).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch

from ..core.forward_batch import ForwardBatch
from .base import AttentionBackend


@dataclass
class PagedMetadata:
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    max_seqlen_k: int  # an upper bound on seq_lens (the block table's width in tokens under graphs)
    cu_seqlens_q: torch.Tensor | None = None  # prefill only
    cu_seqlens_k: torch.Tensor | None = None  # prefill only
    max_seqlen_q: int = 1


class PagedBackend(AttentionBackend):
    """A backend whose kernels read a block table (see the module docstring); subclasses call
    their kernels with `self.metadata`."""

    metadata: PagedMetadata
    graph_table: torch.Tensor | None = None

    def _pages(self, seq_lens: list[int]) -> int:
        return max(-(-n // self.pool.page_size) for n in seq_lens)

    def _block_table(self, batch: ForwardBatch, width: int) -> torch.Tensor:
        return self.page_table.table[batch.rows, :width]  # a fresh, contiguous [B, width] tensor

    # --8<-- [start:prepare]
    def prepare(self, batch: ForwardBatch) -> None:
        width = self._pages(batch.seq_lens)
        self.metadata = PagedMetadata(
            block_table=self._block_table(batch, width),
            seq_lens=batch.seq_lens_t,
            max_seqlen_k=max(batch.seq_lens),
        )
        if batch.is_prefill:
            q_starts = [0, *accumulate(batch.query_lens)]
            k_starts = [0, *accumulate(batch.seq_lens)]
            both = self._to_device(q_starts + k_starts)
            self.metadata.cu_seqlens_q, self.metadata.cu_seqlens_k = both.split(len(q_starts))
            self.metadata.max_seqlen_q = max(batch.query_lens)

    # --8<-- [end:prepare]

    def _to_device(self, values: list[int]) -> torch.Tensor:
        # One copy per step; pinned, so it does not wait, and the caching host allocator keeps the
        # block until the copy has run (safe when the host runs a step ahead under overlap).
        host = torch.tensor(values, dtype=torch.int32)
        device = self.pool.k.device
        if device.type == "cuda":
            host = host.pin_memory()
        return host.to(device, non_blocking=True)

    # ------------------------------------------------------------------ CUDA-graph decode

    def graph_unsupported_reason(self, max_batch: int) -> str | None:
        return None

    def prepare_for_capture(self, batch: ForwardBatch, variant: object = None) -> None:
        if self.graph_table is None:
            self.graph_table = torch.zeros_like(self.page_table.table)  # every row of every size
        self.prepare_for_replay(batch)

    # --8<-- [start:replay]
    def prepare_for_replay(self, batch: ForwardBatch, variant: object = None) -> None:
        assert self.graph_table is not None, "replay before capture"
        size, width = batch.size, self._pages(batch.seq_lens)
        # Only the columns in use this step: the kernels never read past a row's last page.
        self.graph_table[:size, :width] = self._block_table(batch, width)
        self.metadata = PagedMetadata(
            block_table=self.graph_table[:size],
            seq_lens=batch.seq_lens_t,
            max_seqlen_k=self.graph_table.shape[1] * self.pool.page_size,
        )

    # --8<-- [end:replay]
