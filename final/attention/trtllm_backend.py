"""FlashInfer's TensorRT-LLM attention kernels over the paged pool (paged.py builds their block
table and lengths).

Decode is `flashinfer.decode.trtllm_batch_decode_with_kv_cache`. On Hopper (and 12.x) it runs
XQA, TensorRT-LLM's decode kernel for grouped queries: the query heads that share a KV head are
processed together, so each page of keys and values is read from memory once per group rather
than once per query head; a long sequence is split over several thread blocks, which merge their
partial softmax results through semaphores kept in the workspace. On Blackwell (10.x) it runs the
trtllm-gen kernels. Prefill is `flashinfer.prefill.trtllm_batch_context_with_kv_cache`, which
exists only as trtllm-gen kernels, so only on 10.x (support.py refuses it elsewhere).

Both want pages of 16, 32 or 64 tokens, a workspace zeroed before its first use (XQA's
semaphores), and `bmm1_scale`: the softmax scale applied to Q·K.

An FP8 pool's scales enter there too: K's scale into `bmm1_scale`, V's as `bmm2_scale` (the
output's). XQA reads an fp8 cache beside a bf16 query; the trtllm-gen prefill kernels of
FlashInfer 0.7.2 have no such form, so the descriptor (registry.py) lets this backend decode
over an fp8 cache only.
"""

from __future__ import annotations

import torch

from ..core.errors import UserError
from .paged import PagedBackend

WORKSPACE_BYTES = 128 * 1024 * 1024


class TrtllmBackend(PagedBackend):
    name = "trtllm"

    def __init__(self, config, pool, page_table, num_heads=None, library=None):
        super().__init__(config, pool, page_table, num_heads)
        try:
            from flashinfer.decode import trtllm_batch_decode_with_kv_cache
            from flashinfer.prefill import trtllm_batch_context_with_kv_cache
        except ImportError as err:
            raise UserError(
                f"--attn trtllm needs FlashInfer with its TensorRT-LLM kernels ({err}): "
                "pip install flashinfer-python"
            ) from err
        self.decode_kernel = trtllm_batch_decode_with_kv_cache
        self.context_kernel = trtllm_batch_context_with_kv_cache
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=pool.k.device)

    def forward(self, layer, q, k, v, batch, out=None):  # out: its kernels return their own
        self.write_kv(layer, k, v, batch)
        kv_cache = (self.pool.k[layer], self.pool.v[layer])  # [pages, page_size, kv_heads, head_dim]
        scales = self.pool.layer_kv(layer)  # 1.0 each unless the pool is fp8
        bmm1_scale, bmm2_scale = self.scale * scales.k_scale, scales.v_scale
        m = self.metadata
        q = q.contiguous()  # the model's q is a strided view of the fused qkv projection
        if batch.is_prefill:
            out = self.context_kernel(
                query=q,
                kv_cache=kv_cache,
                workspace_buffer=self.workspace,
                block_tables=m.block_table,
                seq_lens=m.seq_lens,
                max_q_len=m.max_seqlen_q,
                max_kv_len=m.max_seqlen_k,
                bmm1_scale=bmm1_scale,
                bmm2_scale=bmm2_scale,
                batch_size=batch.size,
                cum_seq_lens_q=m.cu_seqlens_q,
                cum_seq_lens_kv=m.cu_seqlens_k,
                kv_layout="NHD",
            )
        else:
            out = self.decode_kernel(
                query=q,
                kv_cache=kv_cache,
                workspace_buffer=self.workspace,
                block_tables=m.block_table,
                seq_lens=m.seq_lens,
                max_seq_len=m.max_seqlen_k,
                bmm1_scale=bmm1_scale,
                bmm2_scale=bmm2_scale,
                kv_layout="NHD",
            )
        return out.reshape(q.shape[0], -1)
