"""CUDA graphs for decode steps: capture one step per batch size, replay it with new inputs.

A decode step of a small model launches hundreds of kernels that each run for microseconds; the
host's launch overhead, not the GPU, sets the pace. A CUDA graph records the whole step once and
replays it with one launch. The rules that make that work:

- Static addresses. A replay reruns the recorded kernels on the recorded pointers, so every
  input lives in the runner's persistent buffers (`StepBuffers`, the token table, the page
  table) and the output in `GraphRunner.logits`; a step writes its numbers there first.
- Fixed shapes. One graph per batch size in `capture_sizes` (1, 2, 4, 8, then every 8); a batch
  of b requests replays the smallest captured size >= b, its padding rows pointing at the page
  table's padding row, whose pages are the pool's padding page: they compute garbage into a page
  no request owns, and only the real rows' logits are read.
- Fixed kernels. A graph replays the kernels it recorded; where the attention backend picks its
  decode kernel by more than the size (FlashInfer's tensor cores for long contexts), a size gets a
  graph per kernel (`graph_variants`) and each step replays the one its backend picks.
- Nothing on the host inside. No `.item()`, no allocation the graph did not record; the
  attention backend's plan (host work) runs before each replay (`prepare_for_replay`).

Prefill and mixed steps run eagerly here: their token counts vary too much to capture whole,
and attention's plan depends on each request's lengths. Their launch is not small next to their
kernels for prompts of a few thousand tokens, though: prefill_graph.py records everything of such
a step but attention, piece by piece per token bucket (--piecewise-cuda-graph-max-tokens).

`graph_factory` makes the object that captures and replays: `CudaGraph` on a GPU; tests on the
CPU pass `EagerGraph`, which replays by running the recorded function again over the same static
buffers, so everything here but the driver's recording is tested without a GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

import torch

from ..core.forward_batch import ForwardBatch, StepInput

log = logging.getLogger(__name__)

AUTO_MAX_BATCH = 256


def capture_sizes(max_batch: int) -> list[int]:
    """The batch sizes that get a graph: 1, 2, 4, 8, then every 8, up to max_batch (included)."""
    sizes = [s for s in (1, 2, 4) if s < max_batch] + list(range(8, max_batch, 8))
    return sizes + [max_batch]


def padded_size(sizes: list[int], batch: int) -> int | None:
    """The smallest captured size that holds `batch` rows (None: larger than every graph)."""
    return next((s for s in sizes if s >= batch), None)


class Graph(Protocol):
    def capture(self, fn: Callable[[], None]) -> None: ...
    def replay(self) -> None: ...


class CudaGraph:
    """A torch.cuda.CUDAGraph; every graph of the engine allocates from one shared memory pool."""

    def __init__(self, pool: object):
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool

    def capture(self, fn: Callable[[], None]) -> None:
        # Warm up on a side stream first, as PyTorch asks: lazy initialisations (cuBLAS handles,
        # kernel selection) must not happen during capture.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(self.graph, pool=self.pool):
            fn()

    def replay(self) -> None:
        self.graph.replay()


class EagerGraph:
    """A stand-in for CudaGraph on the CPU: `replay` runs the captured function again. Because that
    function reads only static buffers, a replay that sees stale or missing inputs is caught."""

    def __init__(self, pool: object = None):
        self.fn: Callable[[], None] | None = None

    def capture(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        fn()

    def replay(self) -> None:
        assert self.fn is not None, "replay before capture"
        self.fn()


class GraphRunner:
    """Captures the runner's decode step for every size in `capture_sizes(max_batch)` (largest
    first, so smaller graphs reuse the largest one's memory) and replays them."""

    def __init__(self, runner, max_batch: int, graph_factory: Callable[[object], Graph] = CudaGraph):
        self.runner = runner
        self.sizes = capture_sizes(max_batch)
        self.max_batch = max_batch
        device = runner.device
        # In the model's dtype, as the model returns them: the sampler reads bf16 logits as they are.
        self.logits = torch.zeros(max_batch, runner.config.vocab_size, dtype=runner.dtype, device=device)
        pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self.graphs: dict[tuple[int, object], Graph] = {}  # (size, the backend's variant) -> graph
        start = time.perf_counter()
        for size in reversed(self.sizes):
            for variant in runner.backend.graph_variants(size):
                self.graphs[size, variant] = self._capture(size, variant, graph_factory(pool))
        self.capture_s = time.perf_counter() - start

    def can_run(self, step: StepInput) -> bool:
        return not step.is_prefill and step.size <= self.max_batch

    def _batch(self, size: int, seq_lens: list[int]) -> ForwardBatch:
        buf = self.runner.buffers
        rows, seq_lens_t = self.runner.decode_views(size)
        return ForwardBatch(
            is_prefill=False,
            query_lens=[1] * size,
            seq_lens=seq_lens,
            input_ids=buf.input_ids[:size],
            positions=buf.positions[:size],
            rows=rows,
            seq_lens_t=seq_lens_t,
            out_slots=buf.out_slots[:size],
            last_token_index=None,  # every row is a request's last token: the model gathers nothing
        )

    def _capture(self, size: int, variant: object, graph: Graph) -> Graph:
        runner = self.runner
        runner.stage_padding(size)  # every row a padding row: capture touches no live page
        batch = self._batch(size, [1] * size)
        runner.backend.prepare_for_capture(batch, variant)

        def step() -> None:
            runner.decode_inputs(size)
            # The LM head writes straight into the static logits (no [size, vocab] copy after it:
            # 78 MB at batch 256 of a 151,936-token vocabulary).
            runner.model(batch, runner.backend, out=self.logits[:size])

        graph.capture(step)
        return graph

    def run(self, step: StepInput) -> torch.Tensor:
        """Replay the step's padded graph; the logits [sampled requests, vocab] of its real rows."""
        size = padded_size(self.sizes, step.size)
        assert size is not None and self.can_run(step)
        sampled, sampled_index = self.runner.stage_decode(step, size)
        pad = size - step.size
        batch, backend = self._batch(size, step.seq_lens + [1] * pad), self.runner.backend
        variant = backend.graph_variant(batch)
        backend.prepare_for_replay(batch, variant)
        self.graphs[size, variant].replay()
        if sampled == step.size:  # every request is sampled (a decode step's usual case): no copy
            return self.logits[:sampled]
        return self.logits[:size].index_select(0, sampled_index)
