"""The reference backend: gather each request's K and V from its pages, then plain SDPA.

Correct on any device and easy to read; slow, because it copies every cached token of every
request on every step and runs one attention call per request. The fast backends are checked
against it.

For CUDA graphs it has a second decode path with fixed shapes: every row attends over the whole
width of its page-table row, and a mask built on the device from the lengths hides what lies
beyond each request's tokens. That gathers far more than it uses, so it is offered only while
the gather fits in GRAPH_GATHER_BYTES (tiny test models, short contexts).

A pool narrower than the model (--kv-cache-dtype fp8_e4m3 or bf16) is read back into the model's
dtype as it is gathered, each layer's K and V multiplied by their scale (kvcache/pool.py): what
the FP8 kernels do inside, here in plain torch, so FP8 runs (and is tested) on any device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.forward_batch import ForwardBatch
from .base import AttentionBackend

GRAPH_GATHER_BYTES = 1 << 30  # K and V of every row's full page-table width, at the largest batch


class TorchBackend(AttentionBackend):
    name = "torch"
    graph_mode = False

    def prepare(self, batch: ForwardBatch) -> None:
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
        starts = [0]
        for q_len in batch.query_lens:
            starts.append(starts[-1] + q_len)
        self.starts = starts

    def forward(self, layer, q, k, v, batch, out=None):  # out: the reference returns its own
        self.write_kv(layer, k, v, batch)
        if self.graph_mode:
            return self._padded_decode(layer, q, batch)
        cache = self.pool.layer_kv(layer)
        out = torch.empty_like(q)
        for i, slots in enumerate(self.kv_slots):
            start, end = self.starts[i], self.starts[i + 1]
            out[start:end] = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1),
                gather(cache.k, slots, cache.k_scale, q.dtype).transpose(0, 1),
                gather(cache.v, slots, cache.v_scale, q.dtype).transpose(0, 1),
                attn_mask=self.masks[i],
                scale=self.scale,
                enable_gqa=True,
            ).transpose(0, 1)
        return out.reshape(q.shape[0], -1)

    # ------------------------------------------------------------------ capturable decode

    def graph_unsupported_reason(self, max_batch: int) -> str | None:
        width = self.page_table.table.shape[1] * self.pool.page_size
        # Gathered into the model's dtype: an fp8 pool's pages take the model's width once read.
        per_row = 2 * width * self.pool.kv_heads * self.config.head_dim * self.pool.compute_dtype.itemsize
        if max_batch * per_row > GRAPH_GATHER_BYTES:
            return (
                f"the torch backend's capturable decode would gather {max_batch * per_row >> 20} MiB per "
                f"layer (every row's whole context of {width} tokens); use --attn fi, or a smaller "
                "--cuda-graph-max-bs or --max-seq-len-override"
            )
        return None

    def prepare_for_capture(self, batch: ForwardBatch, variant: object = None) -> None:
        self.graph_mode = True  # nothing to plan: the padded path reads only device tensors

    def prepare_for_replay(self, batch: ForwardBatch, variant: object = None) -> None:
        self.graph_mode = True

    def _padded_decode(self, layer: int, q: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """One query per row over the row's whole page-table width, masked beyond its length."""
        rows, page_size = batch.rows.shape[0], self.pool.page_size
        pages = self.page_table.table[batch.rows].long()  # [B, width]
        offsets = torch.arange(page_size, device=q.device)
        slots = (pages.unsqueeze(-1) * page_size + offsets).reshape(rows, -1)  # [B, L]
        cache = self.pool.layer_kv(layer)
        keys = gather(cache.k, slots, cache.k_scale, q.dtype).transpose(1, 2)  # [B, kv_heads, L, head_dim]
        values = gather(cache.v, slots, cache.v_scale, q.dtype).transpose(1, 2)
        visible = torch.arange(slots.shape[1], device=q.device) < batch.seq_lens_t.unsqueeze(1)  # [B, L]
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2),
            keys,
            values,
            attn_mask=visible[:, None, None, :],
            scale=self.scale,
            enable_gqa=True,
        )
        return out.reshape(rows, -1)


def gather(cache: torch.Tensor, slots: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Rows `slots` of one layer's K or V [slots, kv_heads, head_dim], in `dtype`, times `scale`
    (the pool stores x / scale)."""
    if cache.dtype == dtype:
        return cache[slots]
    if cache.dtype.itemsize == 1:  # fp8: gathered through its bytes (not every build indexes fp8)
        rows = cache.view(torch.uint8)[slots].view(cache.dtype)
    else:
        rows = cache[slots]
    rows = rows.to(dtype)
    return rows if scale == 1.0 else rows * scale
