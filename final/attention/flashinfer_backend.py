"""FlashInfer's paged attention kernels: one batched prefill or decode call per layer.

The kernels read K and V straight from the pages, so nothing is gathered. Planning (splitting
the work over thread blocks for this batch's lengths) happens once per step in `prepare` from
host-side lengths (O(batch) host work); every layer then reuses the plan.
"""

from __future__ import annotations

from itertools import accumulate

import torch

from ..core.errors import UserError
from ..core.forward_batch import ForwardBatch
from .base import AttentionBackend

WORKSPACE_BYTES = 128 * 1024 * 1024


class FlashInferBackend(AttentionBackend):
    name = "fi"

    def __init__(self, config, pool, page_table, num_heads=None):
        super().__init__(config, pool, page_table, num_heads)
        device = pool.k.device
        if device.type != "cuda":
            raise UserError("--attn fi runs on CUDA GPUs only; use --attn torch on the CPU")
        try:
            import flashinfer
        except ImportError as err:
            raise UserError(
                "--attn fi needs FlashInfer: pip install flashinfer-python (CUDA GPUs only)"
            ) from err
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        # Tensor cores pay off once several query heads share a KV head (4 or more). Groups that
        # are not a power of two (SmolLM2: 3) take them too: the path the GPU tests ran for that
        # layout (on an H200 the CUDA-core kernel measured as close to torch there).
        group = self.num_heads // pool.kv_heads
        use_tc = group >= 4 or group & (group - 1) != 0
        self.decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=use_tc
        )

    def prepare(self, batch: ForwardBatch) -> None:
        page_size = self.pool.page_size
        num_pages_list = [-(-n // page_size) for n in batch.seq_lens]
        kv_indptr_list = [0, *accumulate(num_pages_list)]
        kv_indptr = torch.tensor(kv_indptr_list, dtype=torch.int32)
        last_page_len = torch.tensor(
            [n - (p - 1) * page_size for n, p in zip(batch.seq_lens, num_pages_list, strict=True)],
            dtype=torch.int32,
        )
        # The page list of every request, gathered on the device from the page table.
        seq_lens = batch.seq_lens_t
        num_pages = (seq_lens + page_size - 1) // page_size
        indptr = torch.cumsum(num_pages, 0) - num_pages
        kv_indices = self.page_table.pages_of(batch.rows, num_pages, indptr, kv_indptr_list[-1])
        c, dtype = self.config, self.pool.k.dtype
        heads, kv_heads = self.num_heads, self.pool.kv_heads
        if batch.is_prefill:
            qo_indptr = torch.tensor([0, *accumulate(batch.query_lens)], dtype=torch.int32)
            self.prefill_wrapper.plan(
                qo_indptr,
                kv_indptr,
                kv_indices,
                last_page_len,
                heads,
                kv_heads,
                c.head_dim,
                page_size,
                causal=True,
                q_data_type=dtype,
                kv_data_type=dtype,
            )
        else:
            self.decode_wrapper.plan(
                kv_indptr,
                kv_indices,
                last_page_len,
                heads,
                kv_heads,
                c.head_dim,
                page_size,
                pos_encoding_mode="NONE",
                q_data_type=dtype,
                kv_data_type=dtype,
            )

    def forward(self, layer, q, k, v, batch):
        self.pool.store(layer, batch.out_slots, k, v)
        wrapper = self.prefill_wrapper if batch.is_prefill else self.decode_wrapper
        out = wrapper.run(q, (self.pool.k[layer], self.pool.v[layer]))
        return out.reshape(q.shape[0], -1)
