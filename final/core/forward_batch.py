"""What one forward pass computes, as the model and the attention backends see it.

The scheduler decides which requests run; the model runner turns that into a ForwardBatch:
host-side lengths (for kernel planning) and device tensors (for the kernels). Nothing here knows
about requests, so the attention backends and the model depend on this file alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class ForwardBatch:
    """For each request i, its tokens [seq_lens[i] - query_lens[i], seq_lens[i]) are computed."""

    is_prefill: bool  # False: every request computes exactly one token (a pure decode step)
    query_lens: list[int]  # tokens computed this step, per request
    seq_lens: list[int]  # tokens in the cache after this step, per request
    input_ids: torch.Tensor  # [T] the new tokens of every request, concatenated
    positions: torch.Tensor  # [T]
    rows: torch.Tensor  # [B] each request's page-table row
    out_slots: torch.Tensor  # [T] pool slot receiving each new token's K and V
    last_token_index: torch.Tensor  # [S] where each sampled request's last token sits in [T]

    @property
    def size(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


class Attention(Protocol):
    """What a model layer calls: attention over the pool for this batch (see final/attention)."""

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor: ...
