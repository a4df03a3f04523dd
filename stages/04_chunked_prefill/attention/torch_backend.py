"""The reference backend: gather each request's K and V from its pages, then plain SDPA.

Correct on any device and easy to read; slow, because it copies every cached token of every
request on every step and runs one attention call per request. The fast backends are checked
against it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..request import Batch
from .base import AttentionBackend


class TorchBackend(AttentionBackend):
    def prepare(self, batch: Batch) -> None:
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
