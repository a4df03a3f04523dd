"""FlashInfer's paged attention kernels: one batched prefill or decode call per layer.

The kernels read K and V straight from the pages, so nothing is gathered. Planning (splitting
the work over thread blocks for this batch's lengths) happens once per step in `prepare`; every
layer then reuses the plan.

For CUDA graphs, each captured batch size gets a decode wrapper in FlashInfer's graph mode: its
page list (`indptr`, `indices`, last-page lengths) lives in buffers we own, whose addresses the
graph records. They are shared by every size, since one graph replays at a time, and
`prepare_for_replay` plans into them on the host before each replay.

Planning never waits for the GPU's current step (stage 06 plans step N+1 while step N runs),
with one exception that makes it safe: `plan` writes its work split into a pinned host buffer and
copies that to the device asynchronously, so the next plan first waits until the previous plan's
copy has run (an event recorded after it; by then it almost always has).
"""

from __future__ import annotations

from itertools import accumulate

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
        self.flashinfer = flashinfer
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        # Tensor cores pay off once several query heads share a KV head (4 or more). Groups that
        # are not a power of two (SmolLM2: 3) take them too: the path the GPU tests ran for that
        # layout (on an H200 the CUDA-core kernel measured as close to torch there).
        group = config.num_heads // config.num_kv_heads
        self.use_tc = group >= 4 or group & (group - 1) != 0
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=self.use_tc
        )
        self.current_decode = self.decode  # the wrapper the next decode forward runs
        self.graph_decodes: dict[int, object] = {}  # batch size -> graph-mode wrapper
        self.graph_buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.last_plan: torch.cuda.Event | None = None  # recorded after the last plan's copies

    def prepare(self, batch: Batch) -> None:
        if batch.is_prefill:
            self._plan(self.prefill, batch)
        else:
            self.current_decode = self.decode
            self._plan(self.decode, batch)

    # --8<-- [start:prepare]
    def _plan(self, wrapper, batch: Batch) -> None:
        # plan() fills a pinned host buffer of the wrapper and queues its copy to the device: the
        # previous plan's copy must have run before that buffer is overwritten.
        if self.last_plan is not None:
            self.last_plan.synchronize()
        page_size = self.pool.page_size
        num_pages = [-(-n // page_size) for n in batch.seq_lens]
        last_page_len = [n - (p - 1) * page_size for n, p in zip(batch.seq_lens, num_pages, strict=True)]
        kv_indptr = [0, *accumulate(num_pages)]
        kv_indices = self.page_table.pages_of(batch.rows, num_pages)
        c, dtype = self.config, self.pool.k.dtype

        def host(values: list[int]) -> torch.Tensor:  # plan() reads these on the host: pinned
            return torch.tensor(values, dtype=torch.int32).pin_memory()

        if batch.is_prefill:
            wrapper.plan(
                host([0, *accumulate(batch.query_lens)]), host(kv_indptr), kv_indices, host(last_page_len),
                c.num_heads, c.num_kv_heads, c.head_dim, page_size, causal=True, q_data_type=dtype,
                kv_data_type=dtype,
            )  # fmt: skip
        else:
            wrapper.plan(
                host(kv_indptr), kv_indices, host(last_page_len), c.num_heads, c.num_kv_heads, c.head_dim,
                page_size, pos_encoding_mode="NONE", q_data_type=dtype, kv_data_type=dtype,
            )  # fmt: skip
        self.last_plan = torch.cuda.Event()
        self.last_plan.record()

    # --8<-- [end:prepare]

    # --8<-- [start:graph]
    def graph_unsupported_reason(self, max_batch: int) -> str | None:
        return None

    def prepare_for_capture(self, batch: Batch) -> None:
        size = len(batch.seq_lens)
        if self.graph_buffers is None:
            # Room for the largest batch the page table holds, every page of every row.
            rows, width = self.page_table.table.shape
            device = self.workspace.device
            self.graph_buffers = (
                torch.zeros(rows + 1, dtype=torch.int32, device=device),  # indptr
                torch.zeros(rows * width, dtype=torch.int32, device=device),  # indices
                torch.zeros(rows, dtype=torch.int32, device=device),  # last page lengths
            )
        indptr, indices, last_page_len = self.graph_buffers
        self.graph_decodes[size] = self.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=self.use_tc,
            paged_kv_indptr_buffer=indptr[: size + 1], paged_kv_indices_buffer=indices,
            paged_kv_last_page_len_buffer=last_page_len[:size],
        )  # fmt: skip
        self.prepare_for_replay(batch)

    def prepare_for_replay(self, batch: Batch) -> None:
        # plan() copies this step's page lists into the wrapper's buffers and its work split into
        # the workspace: the recorded kernels read both from the same addresses every replay.
        self.current_decode = self.graph_decodes[len(batch.seq_lens)]
        self._plan(self.current_decode, batch)

    # --8<-- [end:graph]

    def forward(self, layer, q, k, v, batch):
        self.pool.store(layer, batch.out_slots, k, v)
        wrapper = self.prefill if batch.is_prefill else self.current_decode
        out = wrapper.run(q, (self.pool.k[layer], self.pool.v[layer]))
        return out.reshape(q.shape[0], -1)
