"""FlashAttention over the paged pool: one kernel call per layer reads every request's pages
through a block table (paged.py builds it), for prefill and decode alike.

FlashAttention tiles the attention matrix: a thread block holds a tile of queries in on-chip
memory and streams the keys and values past it tile by tile, keeping a running softmax, so the
scores never go to GPU memory. With a block table the key tiles are gathered from the pages.

Three generations of the library, in the order we prefer them (libraries.py says which GPUs and
page sizes each takes):
- FlashAttention 4 (`flash-attn-4`): CuTe DSL kernels for Hopper and Blackwell, compiled on first
  use; `flash_attn.cute.flash_attn_varlen_func` with `page_table` and `seqused_k`.
- FlashAttention 3 (Hopper): `flash_attn_interface.flash_attn_with_kvcache` with `page_table`,
  `cache_seqlens` and, for prefill, `cu_seqlens_q`.
- FlashAttention 2: `flash_attn.flash_attn_varlen_func` with `block_table` for prefill,
  `flash_attn_with_kvcache` for decode; pages of a multiple of 256 tokens.
All three align the causal mask to the bottom right, as our prefix-then-chunk layout needs.
"""

from __future__ import annotations

import importlib
from typing import Protocol

import torch

from ..core.errors import UserError
from .fa4_replay import FA4Replay
from .libraries import FLASH_ATTENTION_2, FLASH_ATTENTION_3, FLASH_ATTENTION_4
from .paged import PagedBackend, PagedMetadata
from .spec import Library


class Kernels(Protocol):
    """q [T, heads, head_dim] and one layer's pages [pages, page_size, kv_heads, head_dim] ->
    [T, heads, head_dim]. A prefill's `out`: where to write it, if the kernel call can (FlashAttention
    4's replay can; the others return their own)."""

    def prefill(self, q, k_cache, v_cache, m: PagedMetadata, scale: float, out=None) -> torch.Tensor: ...
    def decode(self, q, k_cache, v_cache, m: PagedMetadata, scale: float) -> torch.Tensor: ...


# --8<-- [start:fa4]
class FlashAttention4:
    """FlashAttention 4 compiles a kernel on first use (seconds) per compile key: the arguments'
    kinds (dtypes, head sizes, which optional ones are set) and flags derived from them; shapes
    and values are runtime arguments. An argument whose kind changes from step to step compiles
    a new kernel in the middle of serving, so we pass none.

    `max_seqlen_q` was one (flash-attn-4 4.0.0b36, flash_attn/cute/interface.py): a host integer
    sets `is_static_persistent` (line 1367; true when every request's queries fit one 128-row
    tile, at most 64 tokens with 2 query heads per KV head), which is in the key (line 1512) but
    never reaches the Hopper kernel (lines 1632, 1931). A prompt longer than the warm-up's compiled
    a second, identical kernel: seconds inside the first long prompt's TTFT (issue 26). Without it the
    bound is the step's query count and the flag stays false (line 950): one prefill kernel per
    head size, dtype, causal mask and page size on Hopper. Blackwell may add one for steps of at
    most 128 / group rows (one Q tile per CTA, line 389); prefills of more than 256 requests add
    one on either (line 82: a batch-lookup aid the interface computes per call, line 1331).
    tests/final/attention/test_final_gpu_attention.py counts them.

    So on Hopper every call of a kind (phase, and that side of 256 requests) ends in the same
    compiled call, and the interface's Python that gets there (an autograd Function, checks,
    heuristics, the key: a few hundred lines per layer per step, on the host, in the eager
    prefill's TTFT) has nothing left to decide. `replay` (fa4_replay.py) records that call once
    per kind and then makes it directly, unless the interface passed anything it computed per
    call; `FINAL_FA4_REPLAY=0` turns it off.
    """

    def __init__(self, module, replay: bool | None = None):
        self.attention = module.flash_attn_varlen_func  # returns (out, lse); lse is None here
        self.replay = FA4Replay(module, replay)  # replay None: as FINAL_FA4_REPLAY says

    def prefill(self, q, k_cache, v_cache, m, scale, out=None):
        return self._call("prefill", q, k_cache, v_cache, m, scale, cu_seqlens_q=m.cu_seqlens_q, out=out)

    def decode(self, q, k_cache, v_cache, m, scale):
        # One query per request: the batched layout [B, 1, heads, head_dim], no cumulative lengths.
        # num_splits stays 1: FlashAttention 4 has no split-KV kernels on Hopper.
        return self._call("decode", q.unsqueeze(1), k_cache, v_cache, m, scale).squeeze(1)

    def _call(self, phase, q, k_cache, v_cache, m, scale, cu_seqlens_q=None, out=None):
        # Tensors, and arguments that are the same at every step of a phase: nothing here changes
        # the key (the prefill's cumulative lengths are there at every prefill, never at a decode).
        def official():
            return self.attention(
                q,
                k_cache,
                v_cache,
                cu_seqlens_q=cu_seqlens_q,
                seqused_k=m.seq_lens,
                page_table=m.block_table,
                softmax_scale=scale,
                causal=True,
            )[0]

        lengths = () if cu_seqlens_q is None else (cu_seqlens_q,)
        ours = (q, k_cache, v_cache, *lengths, m.seq_lens, m.block_table)
        return self.replay(phase, ours, scale, official, out)


# --8<-- [end:fa4]


class FlashAttention3:
    def __init__(self, module):
        self.attention = module.flash_attn_with_kvcache

    def prefill(self, q, k_cache, v_cache, m, scale, out=None):  # out: see Kernels
        return self.attention(
            q,
            k_cache,
            v_cache,
            cache_seqlens=m.seq_lens,
            page_table=m.block_table,
            cu_seqlens_q=m.cu_seqlens_q,
            max_seqlen_q=m.max_seqlen_q,
            softmax_scale=scale,
            causal=True,
        )

    def decode(self, q, k_cache, v_cache, m, scale):
        out = self.attention(
            q.unsqueeze(1),
            k_cache,
            v_cache,
            cache_seqlens=m.seq_lens,
            page_table=m.block_table,
            softmax_scale=scale,
            causal=True,
        )
        return out.squeeze(1)


class FlashAttention2:
    def __init__(self, module):
        self.varlen, self.with_kvcache = module.flash_attn_varlen_func, module.flash_attn_with_kvcache

    def prefill(self, q, k_cache, v_cache, m, scale, out=None):  # out: see Kernels
        return self.varlen(
            q,
            k_cache,
            v_cache,
            m.cu_seqlens_q,
            m.cu_seqlens_k,
            m.max_seqlen_q,
            m.max_seqlen_k,
            softmax_scale=scale,
            causal=True,
            block_table=m.block_table,
        )

    def decode(self, q, k_cache, v_cache, m, scale):
        out = self.with_kvcache(
            q.unsqueeze(1),
            k_cache,
            v_cache,
            cache_seqlens=m.seq_lens,
            block_table=m.block_table,
            softmax_scale=scale,
            causal=True,
        )
        return out.squeeze(1)


# The module each library is imported as, and its calls.
KERNELS = {
    FLASH_ATTENTION_4: ("flash_attn.cute", FlashAttention4),
    FLASH_ATTENTION_3: ("flash_attn_interface", FlashAttention3),
    FLASH_ATTENTION_2: ("flash_attn", FlashAttention2),
}


class FlashAttentionBackend(PagedBackend):
    name = "fa"

    def __init__(self, config, pool, page_table, num_heads=None, library: Library = FLASH_ATTENTION_4):
        super().__init__(config, pool, page_table, num_heads)
        module_name, kernels = KERNELS[library]
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:  # found, but it or a dependency does not import
            raise UserError(
                f"--attn fa: {library.name} is installed but does not import ({err}); {library.install}"
            ) from err
        self.library = library
        self.kernels: Kernels = kernels(module)

    def forward(self, layer, q, k, v, batch, out=None):
        self.write_kv(layer, k, v, batch)
        k_cache, v_cache = self.pool.k[layer], self.pool.v[layer]
        if batch.is_prefill:
            result = self.kernels.prefill(q, k_cache, v_cache, self.metadata, self.scale, out=out)
        else:
            result = self.kernels.decode(q, k_cache, v_cache, self.metadata, self.scale)
        return result.reshape(q.shape[0], -1)
