"""The reference backend: gather each request's K and V from its pages, then plain SDPA.

Correct on any device and easy to read; slow, because it copies every cached token of every
request on every step and runs one attention call per request. The fast backends are checked
against it.

Its graph path has fixed shapes: every row gathers the whole width of its page-table row (the
model's whole context) and masks what lies past the row's position. That reads far more than it
uses, so it is offered only while the gather fits in GRAPH_GATHER_BYTES per layer: tiny test
models and short contexts. It exists so that the CPU tests can replay graphs, and so that
`--attn torch` on a GPU is checked against FlashInfer with graphs on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..request import Batch
from .base import AttentionBackend

GRAPH_GATHER_BYTES = 1 << 30  # K and V of every row's whole context, at the largest graph


class TorchBackend(AttentionBackend):
    graph_mode = False  # True while a graph's static batch runs (capture, and the CPU stand-in's replay)

    def prepare(self, batch: Batch) -> None:
        self.graph_mode = False
        device, page_size = batch.rows.device, self.pool.page_size
        self.kv_slots: list[torch.Tensor] = []  # per request: slots of all its cached tokens
        self.masks: list[torch.Tensor | None] = []
        for i, (q_len, seq_len) in enumerate(zip(batch.query_lens, batch.seq_lens, strict=True)):
            positions = torch.arange(seq_len, device=device)
            self.kv_slots.append(self.page_table.slots(batch.rows[i].expand(seq_len), positions, page_size))
            # The queries are the last q_len positions; query at position p sees keys 0..p.
            query_pos = positions[seq_len - q_len :]
            self.masks.append(None if q_len == 1 else positions.unsqueeze(0) <= query_pos.unsqueeze(1))
        self.starts = [0, *torch.tensor(batch.query_lens).cumsum(0).tolist()]

    # --8<-- [start:forward]
    def forward(self, layer, q, k, v, batch):
        self.pool.store(layer, batch.out_slots, k, v)
        if self.graph_mode:
            return self._padded_decode(layer, q, batch)
        k_pool = self.pool.k[layer].view(-1, *k.shape[1:])  # [slots, kv_heads, head_dim]
        v_pool = self.pool.v[layer].view(-1, *v.shape[1:])
        out = torch.empty_like(q)
        for i, slots in enumerate(self.kv_slots):
            start, end = self.starts[i], self.starts[i + 1]
            out[start:end] = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1),
                k_pool[slots].transpose(0, 1),
                v_pool[slots].transpose(0, 1),
                attn_mask=self.masks[i],
                enable_gqa=True,
            ).transpose(0, 1)
        return out.reshape(q.shape[0], -1)

    # --8<-- [end:forward]

    # --8<-- [start:graph]
    def graph_unsupported_reason(self, max_batch: int) -> str | None:
        width = self.page_table.table.shape[1] * self.pool.page_size
        per_row = 2 * width * self.config.num_kv_heads * self.config.head_dim * self.pool.k.dtype.itemsize
        if max_batch * per_row > GRAPH_GATHER_BYTES:
            return (f"the torch backend's fixed-shape decode would gather {max_batch * per_row >> 20} MiB per "
                    f"layer (every row's whole context of {width} tokens); use --attn fi, or a smaller "
                    "--cuda-graph-max-bs or --max-seq-len-override")  # fmt: skip
        return None

    def prepare_for_capture(self, batch: Batch) -> None:
        self.graph_mode = True  # nothing to plan: the padded path reads only the static tensors

    def prepare_for_replay(self, batch: Batch) -> None:
        self.graph_mode = True

    def _padded_decode(self, layer: int, q: torch.Tensor, batch: Batch) -> torch.Tensor:
        """One query per row over its page-table row's whole width, masked past its position."""
        rows, page_size = q.shape[0], self.pool.page_size
        pages = self.page_table.table[batch.rows].long()  # [B, width in pages]
        offsets = torch.arange(page_size, device=q.device)
        slots = (pages.unsqueeze(-1) * page_size + offsets).reshape(rows, -1)  # [B, L]
        kv_heads, head_dim = self.config.num_kv_heads, self.config.head_dim
        keys = self.pool.k[layer].view(-1, kv_heads, head_dim)[slots].transpose(1, 2)  # [B, kv_heads, L, D]
        values = self.pool.v[layer].view(-1, kv_heads, head_dim)[slots].transpose(1, 2)
        # The query sits at `position` and sees keys 0..position: the mask comes from a static
        # tensor, so the same recorded kernels serve every length.
        visible = torch.arange(slots.shape[1], device=q.device) <= batch.positions.unsqueeze(1)  # [B, L]
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), keys, values, attn_mask=visible[:, None, None, :], enable_gqa=True
        )  # [B, heads, 1, D]
        return out.reshape(rows, -1)

    # --8<-- [end:graph]
