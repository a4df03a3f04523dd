"""The model runner: owns the model, the KV pool, the page table, the device token table and the
attention backend, and turns one scheduled step into logits (eagerly; the decode graphs that
replay its buffers are the executor's).

Per step the host sends O(batch) numbers (rows, lengths, the index of each sampled request's last
token) plus the prompt tokens it supplies, in one copy; positions, pool slots and the inputs of
decoding requests are computed on the device. Every per-step tensor is a view of a persistent
buffer, so its address never changes: what CUDA-graph replay (engine/graph.py) needs.
"""

from __future__ import annotations

import gc
from array import array
from collections.abc import Callable
from itertools import accumulate

import torch

from ..attention.factory import create_backend
from ..core.forward_batch import ForwardBatch, StepInput
from ..distributed.tp import TPInfo
from ..kernels import step_metadata
from ..kvcache.page_table import PageTable
from ..kvcache.pool import KVPool
from ..models.kv_scales import read_kv_scales
from ..models.loader import load_model
from .resolve import ResolvedConfig

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
    """One rank's model and KV cache. The executor (executor.py) decides the pool's size, builds it
    (`build`) and owns the decode graphs, which replay this runner's static buffers."""

    def __init__(self, resolved: ResolvedConfig, device: torch.device, tp: TPInfo | None = None):
        config = resolved.model
        self.config, self.device, self.dtype = config, device, resolved.dtype
        self.resolved = resolved
        self.tp = tp or TPInfo()
        self.page_size = resolved.page_size
        self.model = load_model(resolved.model_dir, config, device, self.dtype, self.tp)
        # Under TP, every rank reads its own shards, some faster than others: meet on the host
        # before the first collective on the device, whose timeout is meant for a hung rank.
        self.tp.barrier()
        self.kv_heads = self.tp.local_kv_heads(config.num_kv_heads)
        self.num_pages = 0
        # An FP8 pool's per-layer scales: the checkpoint's, else None (1.0; kvcache/pool.py says why).
        self.kv_dtype = resolved.kv_dtype
        fp8 = self.kv_dtype == torch.float8_e4m3fn
        self.kv_scales = read_kv_scales(resolved.model_dir, config.num_layers) if fp8 else None

    def build(self, num_pages: int) -> None:
        """The KV pool, the page table, the token table, the step buffers and the attention backend."""
        resolved, config, device = self.resolved, self.config, self.device
        self.num_pages = num_pages
        self.pool = KVPool(
            config,
            num_pages,
            self.page_size,
            device,
            self.kv_dtype,
            self.kv_heads,
            self.dtype,
            self.kv_scales,
        )
        max_running = resolved.max_running_requests
        pages_per_request = -(-config.max_context // self.page_size)
        self.page_table = PageTable(max_running, pages_per_request, device, self.pool.padding_page)
        # The token each request (by page-table row) feeds into its next decode step: its last
        # sampled token, written on the device by `record_tokens` (the padding row's stays 0).
        self.token_table = torch.zeros(max_running + 1, dtype=torch.int32, device=device)
        # A mixed step carries a prefill budget of prompt tokens plus one token per running request.
        self.buffers = StepBuffers(resolved.max_prefill_length + max_running, max_running + 1, device)
        heads = self.tp.split(config.num_heads)
        self.backend = create_backend(resolved.attention, config, self.pool, self.page_table, heads)

    def teardown(self) -> None:
        """Drop what `build` made (the executor measures the graphs against a scratch build)."""
        del self.pool, self.page_table, self.token_table, self.buffers, self.backend
        gc.collect()  # the graphs and the backend refer to each other

    def page_bytes(self) -> int:
        return KVPool.bytes_per_page(self.config, self.page_size, self.kv_dtype, self.kv_heads)

    def pages_that_fit(self, memory_ratio: float, reserve: int) -> int:
        if self.device.type != "cuda":
            return CPU_KV_TOKENS // self.page_size
        # The weights are loaded: give the KV cache what is free, minus the graphs' share and
        # (1 - ratio) of the card, which stays for activations, workspaces and the allocator's
        # slack. One page less: the padding page.
        free, total = torch.cuda.mem_get_info(self.device)
        return int((free - reserve - (1 - memory_ratio) * total) // self.page_bytes()) - 1

    def prepare(self, step: StepInput) -> ForwardBatch:
        """Copy the step's numbers to the device in one transfer and derive the rest there: token
        ids, positions, and each token's K/V slot."""
        buf, b, t = self.buffers, step.size, step.num_tokens
        if t > buf.max_tokens or b >= buf.max_batch:
            raise ValueError(f"a step of {b} requests and {t} tokens exceeds the runner's buffers")
        ends = list(accumulate(step.query_lens))
        sampled = [i for i, s in enumerate(step.sampled) if s]
        last = [ends[i] - 1 for i in sampled]
        s = len(sampled)
        layout = (
            step.rows + step.query_lens + step.seq_lens + last + sampled + step.from_table + step.input_ids
        )
        parts = torch.split(self._send(layout), [b, b, b, s, s, b, t])
        rows, query_lens, seq_lens = buf.rows[:b], buf.query_lens[:b], buf.seq_lens[:b]
        rows.copy_(parts[0])
        query_lens.copy_(parts[1])
        seq_lens.copy_(parts[2])
        buf.last_token_index[:s].copy_(parts[3])
        torch.index_select(rows, 0, parts[4], out=buf.sampled_rows[:s])
        input_ids, positions, out_slots = buf.input_ids[:t], buf.positions[:t], buf.out_slots[:t]
        input_ids.copy_(parts[6])
        self.page_table.flush()
        # Positions, slots, and a decoding request's token from the table: one kernel on a GPU
        # (kernels/step_metadata.py), where the torch ops it replaces were a dozen launches.
        step_metadata.step_inputs(
            self.token_table,
            self.page_table.table,
            rows,
            query_lens,
            seq_lens,
            parts[5],
            self.page_size,
            input_ids,
            positions,
            out_slots,
            max(step.query_lens),
        )
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

    def forward(self, step: StepInput, between_layers: Callable[[], None] | None = None) -> torch.Tensor:
        """Logits [sampled requests, vocab] for the token after each sampled request's last one,
        computed eagerly (the executor replays a decode graph instead where it has one);
        `between_layers` is called after each layer is queued (ForwardBatch)."""
        batch = self.prepare(step)
        batch.between_layers = between_layers
        self.backend.prepare(batch)
        return self.model(batch, self.backend)

    # ------------------------------------------------------------------ decode graphs' inputs

    def decode_views(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows and lengths a decode graph of `size` rows reads: the first 2 * size ints of the
        staging buffer, where `stage_decode`'s one host-to-device copy puts them. Fixed addresses
        per size (what a graph needs), and no device copy into other buffers after the transfer."""
        staging = self.buffers.staging
        return staging[:size], staging[size : 2 * size]

    def stage_padding(self, size: int) -> None:
        """Every one of the first `size` rows a padding row of length 1 (what a graph is captured on)."""
        rows, seq_lens = self.decode_views(size)
        rows.fill_(self.page_table.padding_row)
        seq_lens.fill_(1)

    def stage_decode(self, step: StepInput, size: int) -> tuple[int, torch.Tensor]:
        """Send a decode step's numbers, padded to `size` rows, to where a graph of that size reads
        them (`decode_views`). Returns how many rows are sampled and their indices (a device view,
        int32). A request whose token the host supplies (a prompt's 1-token chunk, a recomputed
        answer's last token) has it written into the token table, where the graph reads every row's."""
        buf, b = self.buffers, step.size
        pad = size - b
        sampled = [i for i, s in enumerate(step.sampled) if s]
        host = [i for i, from_table in enumerate(step.from_table) if not from_table]
        host_rows, host_tokens = [step.rows[i] for i in host], [step.input_ids[i] for i in host]
        s, h = len(sampled), len(host)
        layout = step.rows + [self.page_table.padding_row] * pad + step.seq_lens + [1] * pad
        layout += sampled + host_rows + host_tokens
        rows, _, sampled_index, to_rows, tokens = torch.split(self._send(layout), [size, size, s, h, h])
        torch.index_select(rows, 0, sampled_index, out=buf.sampled_rows[:s])
        if h:
            self.token_table[to_rows] = tokens
        self.page_table.flush()
        return s, sampled_index

    def decode_inputs(self, size: int) -> None:
        """The inputs of a decode step of `size` rows, from the staged rows and lengths alone (this
        runs inside the graph): each row's token from the token table, its position, its K/V slot."""
        buf = self.buffers
        rows, seq_lens = self.decode_views(size)
        step_metadata.decode_inputs(
            self.token_table,
            self.page_table.table,
            rows,
            seq_lens,
            self.page_size,
            buf.input_ids[:size],
            buf.positions[:size],
            buf.out_slots[:size],
        )  # one kernel on a GPU, the torch ops of step_metadata.torch_decode_inputs elsewhere

    def _send(self, layout: list[int]) -> torch.Tensor:
        """Copy a step's numbers to the device staging buffer in one transfer; the device view."""
        # Pinned memory from PyTorch's caching host allocator: the copy is asynchronous, and the block
        # is not reused before the copy has run, even when the host runs a step ahead (overlap).
        # array.array reads a list of ints three times faster than torch.tensor does (a long
        # prefill's step is thousands of them: 0.5 against 0.15 ms for 8k on a CPU core here).
        host = torch.frombuffer(array("i", layout), dtype=torch.int32)
        if self.device.type == "cuda":
            host = host.pin_memory()
        dev = self.buffers.staging[: len(layout)]
        dev.copy_(host, non_blocking=True)
        return dev

    def record_tokens(self, tokens: torch.Tensor) -> None:
        """The tokens just sampled (one per sampled request of the last prepared step, in order)
        are those requests' next decode inputs."""
        rows = self.buffers.sampled_rows[: tokens.shape[0]]
        self.token_table[rows] = tokens.to(torch.int32)
