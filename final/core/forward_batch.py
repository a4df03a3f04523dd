"""What one step computes: the scheduler's description of it (StepInput, host lists), and the
forward pass's view of it (ForwardBatch: the same lengths plus device tensors).

Nothing here knows about requests, so the scheduler, the runner, the attention backends and the
model all depend on this file alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class StepInput:
    """Request i computes query_lens[i] new tokens ending at position seq_lens[i] - 1, in page-table
    row rows[i].

    The host supplies the tokens of prompts (and of a preempted request's recomputed answer). A
    decoding request's one token is the token it sampled last: the runner reads it from its device
    token table (`from_table[i]`), so a step can be launched before the previous step's tokens have
    reached the host (overlap scheduling, stage 06); its entry in `input_ids` is a placeholder."""

    rows: list[int]
    query_lens: list[int]
    seq_lens: list[int]
    sampled: list[bool]  # requests that get logits: a prompt cut mid-way has no next token yet
    input_ids: list[int]  # the new tokens of every request, concatenated (placeholders: see above)
    from_table: list[bool]

    @property
    def size(self) -> int:
        return len(self.rows)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def is_prefill(self) -> bool:
        """Some request computes more than one token (decode kernels need exactly one each)."""
        return max(self.query_lens, default=0) > 1  # max runs in C: this is asked a few times a step


@dataclass
class ForwardBatch:
    """For each request i, its tokens [seq_lens[i] - query_lens[i], seq_lens[i]) are computed.

    The device tensors are views of the runner's persistent buffers (fixed addresses, which CUDA
    graphs need)."""

    is_prefill: bool  # False: every request computes exactly one token (a pure decode step)
    query_lens: list[int]  # tokens computed this step, per request
    seq_lens: list[int]  # tokens in the cache after this step, per request
    input_ids: torch.Tensor  # [T] the new tokens of every request, concatenated
    positions: torch.Tensor  # [T]
    rows: torch.Tensor  # [B] each request's page-table row
    seq_lens_t: torch.Tensor  # [B] seq_lens on the device (int32)
    out_slots: torch.Tensor  # [T] pool slot receiving each new token's K and V
    # [S] where each sampled request's last token sits in [T]; None: every token, in order (a
    # decode graph's rows: the model then gathers nothing, two kernels a step fewer).
    last_token_index: torch.Tensor | None
    # Called by the model after each layer's kernels are queued (an eager step only; engine/delivery.py).
    between_layers: Callable[[], None] | None = None

    @property
    def size(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass(frozen=True)
class LayerKV:
    """One layer's K and V in the pool, every page flattened to token slots: [slots, kv_heads,
    head_dim] each (slot = page * page_size + offset), and the scale each is stored with
    (x / scale; 1.0 unless the pool holds fp8)."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: float = 1.0
    v_scale: float = 1.0


class Attention(Protocol):
    """What a model layer calls: attention over the pool for this batch (see final/attention).

    Writing the step's K and V into the pool is the backend's job unless the model did it itself
    (a fused norm + RoPE + write kernel, kernels/qk_norm_rope_kv.py): it then passes k and v as
    None, and `layer_kv` told it where to write."""

    def layer_kv(self, layer: int) -> LayerKV: ...

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        batch: ForwardBatch,
    ) -> torch.Tensor: ...
