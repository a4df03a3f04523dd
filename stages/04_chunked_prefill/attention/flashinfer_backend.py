"""FlashInfer's paged attention kernels: one batched prefill or decode call per layer.

The kernels read K and V straight from the pages, so nothing is gathered. Planning (splitting
the work over thread blocks for this batch's lengths) happens once per step in `prepare`; every
layer then reuses the plan.
"""

from __future__ import annotations

import torch

from stages.common.errors import UserError

from ..request import Batch
from .base import AttentionBackend

WORKSPACE_BYTES = 128 * 1024 * 1024


class FlashInferBackend(AttentionBackend):
    def __init__(self, config, pool, page_table):
        super().__init__(config, pool, page_table)
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
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        # Tensor cores pay off once several query heads share a KV head (4 or more). Groups that
        # are not a power of two (SmolLM2: 3) take them too: the path the GPU tests ran for that
        # layout (on an H200 the CUDA-core kernel measured as close to torch there).
        group = config.num_heads // config.num_kv_heads
        use_tc = group >= 4 or group & (group - 1) != 0
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=use_tc
        )

    # --8<-- [start:prepare]
    def prepare(self, batch: Batch) -> None:
        page_size = self.pool.page_size
        seq_lens = torch.tensor(batch.seq_lens, dtype=torch.int32)
        num_pages = (seq_lens + page_size - 1) // page_size
        kv_indptr = torch.zeros(batch.size + 1, dtype=torch.int32)
        kv_indptr[1:] = num_pages.cumsum(0)
        last_page_len = seq_lens - (num_pages - 1) * page_size
        kv_indices = self.page_table.pages_of(batch.rows, num_pages.to(batch.rows.device))
        c, dtype = self.config, self.pool.k.dtype
        if batch.is_prefill:
            qo_indptr = torch.zeros(batch.size + 1, dtype=torch.int32)
            qo_indptr[1:] = torch.tensor(batch.query_lens).cumsum(0)
            self.prefill.plan(
                qo_indptr, kv_indptr, kv_indices, last_page_len, c.num_heads, c.num_kv_heads, c.head_dim,
                page_size, causal=True, q_data_type=dtype, kv_data_type=dtype,
            )  # fmt: skip
        else:
            self.decode.plan(
                kv_indptr, kv_indices, last_page_len, c.num_heads, c.num_kv_heads, c.head_dim, page_size,
                pos_encoding_mode="NONE", q_data_type=dtype, kv_data_type=dtype,
            )  # fmt: skip

    # --8<-- [end:prepare]

    def forward(self, layer, q, k, v, batch):
        self.pool.store(layer, batch.out_slots, k, v)
        wrapper = self.prefill if batch.is_prefill else self.decode
        out = wrapper.run(q, (self.pool.k[layer], self.pool.v[layer]))
        return out.reshape(q.shape[0], -1)
