"""The model runner: owns the model, the KV pool, the page table, the device token table and the
attention backend, and turns one scheduled step into logits.

Per step the host sends O(batch) numbers (rows, lengths, the index of each sampled request's last
token) plus the prompt tokens it supplies, in one copy; positions, pool slots and the inputs of
decoding requests are computed on the device. Every per-step tensor is a view of a persistent
buffer, so its address never changes: what CUDA-graph replay (engine/graph.py) needs.
"""

from __future__ import annotations

import logging
from itertools import accumulate
from pathlib import Path

import torch

from ..attention import create_backend
from ..core.config import EngineConfig
from ..core.errors import UserError
from ..core.forward_batch import ForwardBatch, StepInput
from ..core.model_config import ModelConfig
from ..distributed import TPInfo
from ..kvcache import KVPool, PageTable
from ..models import load_model

log = logging.getLogger(__name__)

CPU_KV_TOKENS = 32768  # default pool size on the CPU, where there is no device memory to measure


class StepBuffers:
    """Persistent device buffers for every per-step tensor, sized for the largest step."""

    def __init__(self, max_tokens: int, max_batch: int, device: torch.device):
        def ints(n: int) -> torch.Tensor:
            return torch.zeros(n, dtype=torch.int32, device=device)

        self.max_tokens, self.max_batch = max_tokens, max_batch
        self.input_ids, self.positions, self.out_slots = ints(max_tokens), ints(max_tokens), ints(max_tokens)
        self.rows, self.seq_lens, self.query_lens = ints(max_batch), ints(max_batch), ints(max_batch)
        self.last_token_index = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self.sampled_rows = ints(max_batch)
        # Where a step's numbers land on the device: see ModelRunner.prepare for the layout.
        self.staging = ints(7 * max_batch + max_tokens)


class ModelRunner:
    def __init__(
        self,
        engine_config: EngineConfig,
        folder: Path,
        config: ModelConfig,
        device: torch.device,
        dtype: torch.dtype,
        tp: TPInfo | None = None,
    ):
        self.config, self.device, self.dtype = config, device, dtype
        self.tp = tp or TPInfo()
        self.page_size = engine_config.page_size
        self.model = load_model(folder, config, device, dtype, self.tp)
        kv_heads = self.tp.local_kv_heads(config.num_kv_heads)
        num_pages = engine_config.num_pages or self._pages_that_fit(engine_config.memory_ratio, kv_heads)
        if num_pages < 1:
            raise UserError("no memory left for the KV cache: use a smaller model or raise --memory-ratio")
        self.num_pages = num_pages
        self.pool = KVPool(config, num_pages, self.page_size, device, dtype, kv_heads)
        max_running = engine_config.max_running_requests
        pages_per_request = -(-config.max_context // self.page_size)
        self.page_table = PageTable(max_running, pages_per_request, device, self.pool.padding_page)
        # The token each request (by page-table row) feeds into its next decode step: its last
        # sampled token, written on the device by `record_tokens` (the padding row's stays 0).
        self.token_table = torch.zeros(max_running + 1, dtype=torch.int32, device=device)
        # A mixed step carries a prefill budget of prompt tokens plus one token per running request.
        self.buffers = StepBuffers(engine_config.max_prefill_length + max_running, max_running + 1, device)
        self.backend = create_backend(
            engine_config.attn, config, self.pool, self.page_table, self.tp.split(config.num_heads)
        )
        self._note_cuda_graphs(engine_config.cuda_graph_max_bs)
        log.info(
            "KV cache: %d pages of %d tokens (%d tokens); attention: %s",
            num_pages,
            self.page_size,
            num_pages * self.page_size,
            self.backend.name,
        )

    def _pages_that_fit(self, memory_ratio: float, kv_heads: int) -> int:
        if self.device.type != "cuda":
            return CPU_KV_TOKENS // self.page_size
        page_bytes = KVPool.bytes_per_page(self.config, self.page_size, self.dtype, kv_heads)
        # The weights are loaded: give the KV cache what is free, minus (1 - ratio) of the card,
        # which stays for activations, workspaces and the allocator's slack. One page less: the
        # padding page.
        free, total = torch.cuda.mem_get_info(self.device)
        return int((free - (1 - memory_ratio) * total) // page_bytes) - 1

    def _note_cuda_graphs(self, max_bs: int | None) -> None:
        # Decode CUDA graphs arrive with stage 05; until then say once what the flag does.
        if self.device.type != "cuda":
            if max_bs:
                log.info("--cuda-graph-max-bs %d ignored on the CPU: CUDA graphs need a GPU", max_bs)
        elif max_bs != 0:
            log.info("CUDA graphs are not ported to final/ yet: decode steps run eagerly")

    def prepare(self, step: StepInput) -> ForwardBatch:
        """Copy the step's numbers to the device in one transfer and derive the rest there: token
        ids, positions, and each token's K/V slot."""
        buf, b, t = self.buffers, step.size, step.num_tokens
        if t > buf.max_tokens or b >= buf.max_batch:
            raise ValueError(f"a step of {b} requests and {t} tokens exceeds the runner's buffers")
        ends = list(accumulate(step.query_lens))
        sampled = [i for i, s in enumerate(step.sampled) if s]
        last = [ends[i] - 1 for i in sampled]
        # Requests whose one token is in the token table: where it goes in [T], and which request.
        picks = [i for i, from_table in enumerate(step.from_table) if from_table]
        where = [ends[i] - 1 for i in picks]
        s, d = len(sampled), len(picks)
        layout = step.rows + step.query_lens + step.seq_lens + last + sampled + where + picks + step.input_ids
        # Pinned memory from PyTorch's caching host allocator: the copy is asynchronous, and the block
        # is not reused before the copy has run, even when the host runs a step ahead (overlap).
        host = torch.tensor(layout, dtype=torch.int32)
        if self.device.type == "cuda":
            host = host.pin_memory()
        dev = buf.staging[: len(layout)]
        dev.copy_(host, non_blocking=True)
        parts = torch.split(dev, [b, b, b, s, s, d, d, t])
        rows, query_lens, seq_lens = buf.rows[:b], buf.query_lens[:b], buf.seq_lens[:b]
        rows.copy_(parts[0])
        query_lens.copy_(parts[1])
        seq_lens.copy_(parts[2])
        buf.last_token_index[:s].copy_(parts[3])
        torch.index_select(rows, 0, parts[4], out=buf.sampled_rows[:s])
        input_ids, positions, out_slots = buf.input_ids[:t], buf.positions[:t], buf.out_slots[:t]
        input_ids.copy_(parts[7])
        self.page_table.flush()
        if not step.is_prefill:  # one token each: token i is request i's
            torch.sub(seq_lens, 1, out=positions)
            token_rows = rows
        else:
            owner = torch.repeat_interleave(torch.arange(b, device=self.device), query_lens, output_size=t)
            starts = torch.cumsum(query_lens, 0) - query_lens  # each request's first token in [T]
            first_position = seq_lens - query_lens
            positions.copy_(first_position[owner] + torch.arange(t, device=self.device) - starts[owner])
            token_rows = rows[owner]
        if d:  # a decoding request's token is the one it sampled last: read it from the table
            input_ids[parts[5]] = self.token_table[rows[parts[6]]]
        out_slots.copy_(self.page_table.slots(token_rows, positions, self.page_size))
        return ForwardBatch(
            is_prefill=step.is_prefill,
            query_lens=step.query_lens,
            seq_lens=step.seq_lens,
            input_ids=input_ids,
            positions=positions,
            rows=rows,
            seq_lens_t=seq_lens,
            out_slots=out_slots,
            last_token_index=buf.last_token_index[:s],
        )

    def forward(self, step: StepInput) -> torch.Tensor:
        """Logits [sampled requests, vocab] for the token after each sampled request's last one."""
        batch = self.prepare(step)
        self.backend.prepare(batch)
        return self.model(batch, self.backend)

    def record_tokens(self, tokens: torch.Tensor) -> None:
        """The tokens just sampled (one per sampled request of the last prepared step, in order)
        are those requests' next decode inputs."""
        rows = self.buffers.sampled_rows[: tokens.shape[0]]
        self.token_table[rows] = tokens.to(torch.int32)
