"""The model runner: owns the model, the KV pool, the page table and the attention backend, and
turns one scheduled step into logits.

Per step the host sends O(batch) numbers (new token ids, lengths, page-table rows); the slots of
every token's K and V are computed on the device from the page table. Prefill sends the prompt
tokens, which it must.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

import torch

from ..attention import create_backend
from ..core.config import EngineConfig
from ..core.errors import UserError
from ..core.forward_batch import ForwardBatch
from ..core.model_config import ModelConfig
from ..kvcache import KVPool, PageTable
from ..models import load_model

log = logging.getLogger(__name__)

CPU_KV_TOKENS = 32768  # default pool size on the CPU, where there is no device memory to measure


@dataclass
class StepInput:
    """What the scheduler hands the runner: for request i, query_lens[i] new tokens that end at
    position seq_lens[i] - 1, in page-table row rows[i]."""

    is_prefill: bool
    input_ids: list[int]  # the new tokens of every request, concatenated
    query_lens: list[int]
    seq_lens: list[int]
    rows: list[int]
    sampled: list[bool]  # requests that get logits: a prompt cut mid-way has no next token yet


class ModelRunner:
    def __init__(
        self,
        engine_config: EngineConfig,
        folder: Path,
        config: ModelConfig,
        device: torch.device,
        dtype: torch.dtype,
    ):
        self.config, self.device, self.dtype = config, device, dtype
        self.page_size = engine_config.page_size
        self.model = load_model(folder, config, device, dtype)
        num_pages = engine_config.num_pages or self._pages_that_fit(engine_config.memory_ratio)
        if num_pages < 1:
            raise UserError("no memory left for the KV cache: use a smaller model or raise --memory-ratio")
        self.num_pages = num_pages
        self.pool = KVPool(config, num_pages, self.page_size, device, dtype)
        pages_per_request = -(-config.max_context // self.page_size)
        self.page_table = PageTable(engine_config.max_running_requests, pages_per_request, device)
        self.backend = create_backend(engine_config.attn, config, self.pool, self.page_table)
        self._note_cuda_graphs(engine_config.cuda_graph_max_bs)
        log.info(
            "KV cache: %d pages of %d tokens (%d tokens); attention: %s",
            num_pages, self.page_size, num_pages * self.page_size, self.backend.name,
        )  # fmt: skip

    def _pages_that_fit(self, memory_ratio: float) -> int:
        page_bytes = KVPool.bytes_per_page(self.config, self.page_size, self.dtype)
        if self.device.type != "cuda":
            return CPU_KV_TOKENS // self.page_size
        # The weights are loaded: give the KV cache what is free, minus (1 - ratio) of the card,
        # which stays for activations, workspaces and the allocator's slack.
        free, total = torch.cuda.mem_get_info(self.device)
        return int((free - (1 - memory_ratio) * total) // page_bytes)

    def _note_cuda_graphs(self, max_bs: int | None) -> None:
        # Decode CUDA graphs arrive with stage 05; until then say once what the flag does.
        if self.device.type != "cuda":
            if max_bs:
                log.info("--cuda-graph-max-bs %d ignored on the CPU: CUDA graphs need a GPU", max_bs)
        elif max_bs != 0:
            log.info("CUDA graphs are not ported to final/ yet: decode steps run eagerly")

    def prepare(self, step: StepInput) -> ForwardBatch:
        """The step's device tensors: token ids, positions, rows, and each token's K/V slot."""
        device = self.device
        if step.is_prefill:
            positions = [
                p for q, s in zip(step.query_lens, step.seq_lens, strict=True) for p in range(s - q, s)
            ]
        else:
            positions = [s - 1 for s in step.seq_lens]
        host = torch.tensor([step.input_ids, positions], dtype=torch.long)
        input_ids, positions_t = host.to(device, non_blocking=True)
        lens = torch.tensor([step.rows, step.query_lens], dtype=torch.long).to(device, non_blocking=True)
        rows, query_lens = lens[0], lens[1]
        self.page_table.flush()
        token_rows = (
            rows if not step.is_prefill else rows.repeat_interleave(query_lens, output_size=len(positions))
        )
        return ForwardBatch(
            is_prefill=step.is_prefill,
            query_lens=step.query_lens,
            seq_lens=step.seq_lens,
            input_ids=input_ids,
            positions=positions_t,
            rows=rows,
            out_slots=self.page_table.slots(token_rows, positions_t, self.page_size),
            last_token_index=self._last_token_index(step),
        )

    def _last_token_index(self, step: StepInput) -> torch.Tensor:
        """Where each sampled request's last token sits in the step's tokens."""
        ends = list(accumulate(step.query_lens))
        last = [end - 1 for end, sampled in zip(ends, step.sampled, strict=True) if sampled]
        return torch.tensor(last, dtype=torch.long).to(self.device, non_blocking=True)

    def forward(self, step: StepInput) -> torch.Tensor:
        """Logits [sampled requests, vocab] for the token after each sampled request's last one."""
        batch = self.prepare(step)
        self.backend.prepare(batch)
        return self.model(batch, self.backend)
