"""CUDA graphs for decode steps: record one decode step per batch size, replay it with new inputs.

A decode step of a small model launches about a thousand short kernels; the host, launching them
one by one, sets the pace, not the GPU. A CUDA graph records the step's kernels once and replays
all of them with one launch. Three rules make that work:

- Static addresses. A replay reruns the recorded kernels on the recorded pointers, so a step's
  inputs go into the same buffers every time (`GraphRunner.inputs`), and its logits come out in
  the same buffer (`GraphRunner.logits`).
- Fixed shapes. One graph per batch size in `capture_sizes`; a batch of b requests replays the
  smallest captured size that holds it, padded with rows that point at the pool's padding page.
- Nothing on the host inside. No `.item()`, no `.tolist()`, no Python decision that depends on
  the data: the graph records only what the GPU does. Host work (the attention backend's plan)
  happens before each replay.

Prefill and mixed steps run eagerly. On a machine without CUDA, tests pass `EagerGraph`, whose
replay runs the recorded function again over the same static buffers: everything here except the
driver's recording runs, and is tested, on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from stages.common.model_config import ModelConfig

from .attention import AttentionBackend
from .model import CausalLM
from .page_table import PageTable
from .request import Batch

AUTO_MAX_BATCH = 256  # the largest graph by default (capped by --max-running-requests)


# --8<-- [start:sizes]
def capture_sizes(max_batch: int) -> list[int]:
    """The batch sizes that get a graph: 1, 2, 4, 8, then every 8, up to max_batch (included)."""
    sizes = [s for s in (1, 2, 4) if s < max_batch] + list(range(8, max_batch, 8))
    return sizes + [max_batch]


def padded_size(sizes: list[int], batch: int) -> int | None:
    """The smallest captured size that holds `batch` rows (None: larger than every graph)."""
    return next((s for s in sizes if s >= batch), None)


# --8<-- [end:sizes]


class Graph(Protocol):
    def capture(self, step: Callable[[], None]) -> None: ...
    def replay(self) -> None: ...


# --8<-- [start:cuda_graph]
class CudaGraph:
    """One torch.cuda.CUDAGraph; all of them allocate from one shared memory pool."""

    def __init__(self, pool: object):
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool

    def capture(self, step: Callable[[], None]) -> None:
        # Run once on a side stream first, as PyTorch's docs ask: lazy initialisation (cuBLAS
        # workspaces, kernel selection, FlashInfer's first call) must not happen while recording.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(self.graph, pool=self.pool):
            step()

    def replay(self) -> None:
        self.graph.replay()


# --8<-- [end:cuda_graph]


class EagerGraph:
    """CudaGraph's stand-in on a CPU: replay runs the recorded function again. That function reads
    only the static buffers, so a replay that missed an input would compute the wrong tokens."""

    def __init__(self, pool: object = None):
        self.step: Callable[[], None] | None = None

    def capture(self, step: Callable[[], None]) -> None:
        self.step = step
        step()

    def replay(self) -> None:
        assert self.step is not None, "replay before capture"
        self.step()


class RunnerParts(Protocol):
    """What GraphRunner uses of the model runner (runner.py's ModelRunner has all of it; the
    runner imports this module, so this module names the parts instead of importing the runner)."""

    device: torch.device
    config: ModelConfig
    model: CausalLM
    backend: AttentionBackend
    page_table: PageTable
    page_size: int
    padding_row: int  # the page-table row of the padding page: padded graph rows point at it


class GraphRunner:
    """The runner's decode step captured for every size in `capture_sizes(max_batch)` (largest
    first, so the smaller graphs reuse the largest one's memory), and replayed."""

    def __init__(
        self, runner: RunnerParts, max_batch: int, make_graph: Callable[[object], Graph] = CudaGraph
    ):
        self.runner = runner
        self.sizes = capture_sizes(max_batch)
        self.max_batch = max_batch
        device = runner.device
        # --8<-- [start:buffers]
        # Everything a decode step reads, at fixed addresses: a token id, a position and a
        # page-table row per request (one host-to-device copy fills all three), the slot of each
        # new token's K and V (computed inside the graph), and the logits it writes.
        self.inputs = torch.zeros(3, max_batch, dtype=torch.long, device=device)
        self.input_ids, self.positions, self.rows = self.inputs
        self.out_slots = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.every_row = torch.arange(max_batch, device=device)  # each row is a request's last token
        self.logits = torch.zeros(max_batch, runner.config.vocab_size, device=device)
        # --8<-- [end:buffers]
        pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self.graphs: dict[int, Graph] = {}
        for size in reversed(self.sizes):
            self.graphs[size] = self._capture(size, make_graph(pool))

    def can_run(self, batch: Batch) -> bool:
        return not batch.is_prefill and batch.size <= self.max_batch

    def _static_batch(self, size: int, seq_lens: list[int]) -> Batch:
        """A decode batch of `size` rows whose tensors are views of the static buffers. It names no
        requests: the graph serves whichever requests a step writes into the buffers."""
        return Batch(
            requests=[], is_prefill=False, query_lens=[1] * size, seq_lens=seq_lens, sampled=[True] * size,
            input_ids=self.input_ids[:size], positions=self.positions[:size], out_slots=self.out_slots[:size],
            rows=self.rows[:size], last_token_index=self.every_row[:size],
        )  # fmt: skip

    # --8<-- [start:capture]
    def _capture(self, size: int, graph: Graph) -> Graph:
        runner = self.runner
        # Capture on padding rows only: recording runs the step, and must write into no live page.
        self.input_ids[:size].zero_()
        self.positions[:size].zero_()
        self.rows[:size].fill_(runner.padding_row)
        batch = self._static_batch(size, [1] * size)
        runner.backend.prepare_for_capture(batch)

        def step() -> None:
            slots = runner.page_table.slots(batch.rows, batch.positions, runner.page_size)
            batch.out_slots.copy_(slots)
            self.logits[:size].copy_(runner.model(batch.input_ids, batch.positions, runner.backend, batch))

        graph.capture(step)
        return graph

    # --8<-- [end:capture]

    # --8<-- [start:run]
    def run(self, batch: Batch) -> torch.Tensor:
        """Replay the step's padded graph: logits [sampled requests, vocab]."""
        size = padded_size(self.sizes, batch.size)
        assert size is not None and self.can_run(batch)
        pad = size - batch.size
        reqs = batch.requests
        ids = [r.tokens(r.num_computed, r.num_computed + 1)[0] for r in reqs] + [0] * pad
        positions = [r.num_computed for r in reqs] + [0] * pad
        rows = [r.row for r in reqs] + [self.runner.padding_row] * pad  # padding rows: the padding page
        self.inputs[:, :size].copy_(torch.tensor([ids, positions, rows]), non_blocking=True)
        self.runner.backend.prepare_for_replay(self._static_batch(size, batch.seq_lens + [1] * pad))
        self.graphs[size].replay()
        if all(batch.sampled):
            return self.logits[: batch.size]  # a view: the engine samples from it before the next replay
        # A decode-shaped step can carry a 1-token chunk of a prompt: it gets no logits.
        return self.logits[[i for i, sampled in enumerate(batch.sampled) if sampled]]

    # --8<-- [end:run]
