"""The model runner: owns the model, the KV pool, the page table, the token table and the attention
backend, and turns a scheduled batch into logits. Decode steps replay a CUDA graph when one is
captured. Nothing here waits for the GPU: every host-to-device copy goes through pinned memory,
and a decode input the host has not seen yet is read from the token table, on the device.

Under tensor parallelism every rank has a runner of its own, which holds the rank's shard of the
model and a KV pool for the rank's KV heads only; the ranks' runners run the same batches."""

from __future__ import annotations

import gc
import logging
from itertools import accumulate
from pathlib import Path

import torch

from stages.common.devices import to_device
from stages.common.errors import UserError
from stages.common.model_config import ModelConfig

from .attention import create_backend
from .distributed import TPInfo
from .graph import AUTO_MAX_BATCH, GraphRunner
from .kv_cache import KVPool, PageAllocator
from .model import load_model
from .page_table import PageTable
from .request import Batch

log = logging.getLogger(__name__)

CPU_KV_TOKENS = 32768  # default pool size on the CPU, where there is no device memory to measure


class ModelRunner:
    def __init__(
        self, folder: Path, config: ModelConfig, device: torch.device, dtype: torch.dtype, *, attn: str,
        page_size: int, num_pages: int | None, memory_ratio: float, max_running: int,
        cuda_graph_max_bs: int | None = None, tp: TPInfo | None = None,
    ):  # fmt: skip
        if page_size < 1:
            raise UserError(f"--page-size must be >= 1, got {page_size}")
        if not 0 < memory_ratio <= 1:
            raise UserError(f"--memory-ratio must be in (0, 1], got {memory_ratio}")
        self.config, self.device, self.dtype, self.page_size = config, device, dtype, page_size
        self.attn, self.max_running = attn, max_running
        # --8<-- [start:tp_start]
        self.tp = tp or TPInfo()
        # The rank's own heads: its KV pool and its attention kernels are built for these alone.
        self.local_config = self.tp.local_config(config)
        self.model = load_model(folder, config, device, dtype, self.tp)
        # Ranks read their shards at their own pace: meet on the host before the first collective
        # on the device, whose timeout is meant for a rank that hangs.
        self.tp.barrier()
        self.graphs: GraphRunner | None = None
        graph_batch = self._graph_batch(cuda_graph_max_bs)
        graph_bytes = self._measure_graphs(graph_batch) if graph_batch else None
        # Rank 0's page ids index every rank's pool: all ranks take the size the tightest one fits.
        num_pages = self.tp.min_over_ranks(num_pages or self._pages_that_fit(memory_ratio, graph_bytes or 0))
        # --8<-- [end:tp_start]
        if num_pages < 1:
            raise UserError("no GPU memory left for the KV cache: raise --memory-ratio or set --num-pages")
        self._build(num_pages)
        if graph_bytes is not None:
            self.graphs = GraphRunner(self, graph_batch)
            log.info("CUDA graphs for decode batches of %s: %d MiB, counted before sizing the KV cache",
                     self.graphs.sizes, graph_bytes >> 20)  # fmt: skip
        log.info(
            "KV cache: %d tokens in %d pages (page size %d)", num_pages * page_size, num_pages, page_size
        )

    # --8<-- [start:build]
    def _build(self, num_pages: int) -> None:
        """The KV pool, the page table and the attention backend, with room for padding rows."""
        config, device = self.local_config, self.device
        # One page more than the allocator hands out: the padding page, where the padding rows
        # of a graph write their K and V. No request ever owns it.
        self.pool = KVPool(config, num_pages + 1, self.page_size, device, self.dtype)
        self.allocator = PageAllocator(num_pages)
        self.padding_page = num_pages
        # One row more than requests can run: the padding row, every entry the padding page.
        self.page_table = PageTable(self.max_running + 1, -(-config.max_context // self.page_size), device)
        self.padding_row = self.page_table.acquire_row()
        self.page_table.table[self.padding_row] = self.padding_page
        # Each row's last sampled token, written on the device by the step that samples it: the
        # next decode step reads it from here, so the host need not wait to learn it.
        self.token_table = torch.zeros(self.page_table.table.shape[0], dtype=torch.long, device=device)
        self.backend = create_backend(self.attn, config, self.pool, self.page_table)

    # --8<-- [end:build]

    # --8<-- [start:graph_memory]
    def _graph_batch(self, max_bs: int | None) -> int:
        """The largest decode batch to capture (0: decode runs eagerly)."""
        if max_bs == 0:
            return 0
        if self.device.type != "cuda":
            log.info("CUDA graphs need a GPU: decode steps run eagerly on the %s", self.device.type)
            return 0
        return min(max_bs or AUTO_MAX_BATCH, self.max_running)

    def _measure_graphs(self, max_batch: int) -> int | None:
        """Capture every graph once against a one-page pool and return the device memory they and
        the attention state took, so the KV cache is sized without it (None: the backend cannot
        capture; decode runs eagerly). The graphs are then thrown away and captured again against
        the real pool, whose address they must record."""
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        free_before = torch.cuda.mem_get_info(self.device)[0]
        self._build(1)
        reason = self.backend.graph_unsupported_reason(max_batch)
        if reason is None:
            GraphRunner(self, max_batch)
            torch.cuda.synchronize(self.device)
        else:
            log.info("CUDA graphs off, decode steps run eagerly: %s", reason)
        taken = free_before - torch.cuda.mem_get_info(self.device)[0]
        del self.pool, self.allocator, self.page_table, self.token_table, self.backend
        gc.collect()  # the graphs' closures refer to the runner and its parts
        torch.cuda.empty_cache()
        return max(taken, 0) if reason is None else None

    def _pages_that_fit(self, memory_ratio: float, graph_bytes: int) -> int:
        page_bytes = KVPool.bytes_per_page(self.local_config, self.page_size, self.dtype)
        if self.device.type != "cuda":
            return CPU_KV_TOKENS // self.page_size
        # The weights are loaded: give the KV cache what is free, minus the graphs' share and
        # (1 - ratio) of the card, which stays for activations, workspaces and the allocator's
        # slack. One page less: the padding page.
        free, total = torch.cuda.mem_get_info(self.device)
        return int((free - graph_bytes - (1 - memory_ratio) * total) // page_bytes) - 1

    # --8<-- [end:graph_memory]

    # --8<-- [start:prepare]
    def prepare(self, batch: Batch) -> None:
        """Build the step's device tensors: token ids, positions, and the slot of each token's K/V."""
        ids: list[int] = []
        positions: list[int] = []
        # Inputs only the device knows: where they go in ids, and whose row they come from.
        pending_at: list[int] = []
        pending_rows: list[int] = []
        for req, q_len in zip(batch.requests, batch.query_lens, strict=True):
            if req.num_pending:  # its input is the token the step in flight samples
                pending_at.append(len(ids))
                pending_rows.append(req.row)
                ids.append(0)  # a placeholder, overwritten on the device below
            else:
                ids.extend(req.tokens(req.num_computed, req.num_computed + q_len))
            positions.extend(range(req.num_computed, req.num_computed + q_len))
        device = self.device
        batch.input_ids = to_device(ids, device)
        if pending_at:
            where, rows = to_device([pending_at, pending_rows], device)
            batch.input_ids[where] = self.token_table[rows]
        batch.positions = to_device(positions, device)
        batch.rows = to_device([r.row for r in batch.requests], device)
        query_lens = to_device(batch.query_lens, device)
        batch.out_slots = self.page_table.slots(
            batch.rows.repeat_interleave(query_lens, output_size=len(ids)), batch.positions, self.page_size
        )
        # Only requests whose last token runs this step get logits: a chunk cut mid-prompt has no
        # next token to sample yet.
        ends = list(accumulate(batch.query_lens))
        last = [end - 1 for end, sampled in zip(ends, batch.sampled, strict=True) if sampled]
        batch.last_token_index = to_device(last, device)

    # --8<-- [end:prepare]

    # --8<-- [start:forward]
    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits [sampled requests, vocab] for the token after each sampled request's last one:
        a decode step replays its graph when there is one; prefill and mixed steps run eagerly."""
        if self.graphs is not None and self.graphs.can_run(batch):
            return self.graphs.run(batch)
        self.prepare(batch)
        self.backend.prepare(batch)
        return self.model(batch.input_ids, batch.positions, self.backend, batch)

    # --8<-- [end:forward]

    # --8<-- [start:record_tokens]
    def record_tokens(self, rows: list[int], tokens: torch.Tensor) -> None:
        """The tokens a step just sampled (still on the device) are these rows' next decode inputs."""
        self.token_table[to_device(rows, self.device)] = tokens

    # --8<-- [end:record_tokens]
