"""The model runner: owns the model, the KV pool, the page table and the attention backend, and
turns a scheduled batch into logits."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from stages.common.errors import UserError
from stages.common.model_config import ModelConfig

from .attention import create_backend
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
    ):  # fmt: skip
        if page_size < 1:
            raise UserError(f"--page-size must be >= 1, got {page_size}")
        if not 0 < memory_ratio <= 1:
            raise UserError(f"--memory-ratio must be in (0, 1], got {memory_ratio}")
        self.config, self.device, self.dtype, self.page_size = config, device, dtype, page_size
        self.model = load_model(folder, config, device, dtype)
        num_pages = num_pages or self._pages_that_fit(memory_ratio)
        if num_pages < 1:
            raise UserError("no GPU memory left for the KV cache: raise --memory-ratio or set --num-pages")
        self.pool = KVPool(config, num_pages, page_size, device, dtype)
        self.allocator = PageAllocator(num_pages)
        self.page_table = PageTable(max_running, -(-config.max_context // page_size), device)
        self.backend = create_backend(attn, config, self.pool, self.page_table)
        log.info(
            "KV cache: %d tokens in %d pages (page size %d)", num_pages * page_size, num_pages, page_size
        )

    def _pages_that_fit(self, memory_ratio: float) -> int:
        page_bytes = KVPool.bytes_per_page(self.config, self.page_size, self.dtype)
        if self.device.type != "cuda":
            return CPU_KV_TOKENS // self.page_size
        # The weights are loaded: give the KV cache what is free, minus (1 - ratio) of the card,
        # which stays for activations, workspaces and the allocator's slack.
        free, total = torch.cuda.mem_get_info(self.device)
        return int((free - (1 - memory_ratio) * total) // page_bytes)

    # --8<-- [start:prepare]
    def prepare(self, batch: Batch) -> None:
        """Build the step's device tensors: token ids, positions, and the slot of each token's K/V."""
        ids: list[int] = []
        positions: list[int] = []
        for req, q_len in zip(batch.requests, batch.query_lens, strict=True):
            ids.extend(req.tokens(req.num_computed, req.num_computed + q_len))
            positions.extend(range(req.num_computed, req.num_computed + q_len))
        device = self.device
        batch.input_ids = torch.tensor(ids, dtype=torch.long).to(device, non_blocking=True)
        batch.positions = torch.tensor(positions, dtype=torch.long).to(device, non_blocking=True)
        batch.rows = torch.tensor([r.row for r in batch.requests], dtype=torch.long).to(
            device, non_blocking=True
        )
        query_lens = torch.tensor(batch.query_lens, dtype=torch.long).to(device, non_blocking=True)
        batch.out_slots = self.page_table.slots(
            batch.rows.repeat_interleave(query_lens, output_size=len(ids)), batch.positions, self.page_size
        )
        batch.last_token_index = query_lens.cumsum(0) - 1

    # --8<-- [end:prepare]

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits [batch size, vocab] for the token after each request's last one."""
        self.prepare(batch)
        self.backend.prepare(batch)
        return self.model(batch.input_ids, batch.positions, self.backend, batch)
