"""The engine's warm-up at start: eager prefill steps of the sizes the first requests bring, on the
page table's padding row, before any request is served.

The first prefill of a new size pays costs no later one does: CUDA loads each kernel's module on
its first launch (lazy loading), cuBLAS looks up its kernel for a new GEMM shape, Triton compiles a
kernel for a new specialization of its arguments, and the allocator takes fresh blocks of that
size from the driver. Measured on an H100 (session 11, `offline-phases`, before this warm-up): the
offline workload's first prefill step, 16,384 prompt tokens, took 296 ms where the eight after it
took 38 ms each: a quarter of a second of the run, and of the first requests' time to first token.
The warm-up moves that to the start (the same benchmark's `prefill_first_step_ms` says how much of
it). The decode steps pay theirs when their graphs are captured (graph.py); these are the prefill's.

Every row of a warm-up step is the padding row, whose every page is the pool's padding page
(kvcache/page_table.py): the steps write K/V only there, which nothing reads for a request, take
no page and sample nothing. Every rank runs them from the same place (Executor.__init__), so under
tensor parallelism their collectives meet.
"""

from __future__ import annotations

import time

import torch

from ..core.config import GPU_PREFILL_BUDGET
from ..core.forward_batch import StepInput

# A prefill step of the offline workload admits about 30 prompts at once; a lone long prompt is the
# other shape the first requests bring (its attention kernel picks other tiles).
WARMUP_BATCH = 32
# At most this many prompt tokens a warm-up step (the default budget on a GPU): a budget raised to
# turn chunking off (--max-prefill-length 10**9) must not make the start prefill a million tokens.
WARMUP_MAX_TOKENS = GPU_PREFILL_BUDGET


def warmup_shapes(budget: int, max_len: int, max_requests: int) -> list[tuple[int, int]]:
    """(requests, tokens each) of the warm-up steps: one prompt of the budget (or of the longest a
    request may hold), then the budget shared by up to WARMUP_BATCH prompts."""
    shapes = [(1, min(budget, max_len))]
    batch = min(WARMUP_BATCH, max_requests)
    if batch > 1 and budget // batch > 1:
        shapes.append((batch, min(budget // batch, max_len)))
    return shapes


def padding_step(padding_row: int, requests: int, tokens: int) -> StepInput:
    """A prefill step of `requests` prompts of `tokens` tokens, every row the padding row."""
    return StepInput(
        rows=[padding_row] * requests,
        query_lens=[tokens] * requests,
        seq_lens=[tokens] * requests,
        sampled=[True] * requests,
        input_ids=[0] * (requests * tokens),
        from_table=[False] * requests,
    )


def warm_up(runner, budget: int, max_requests: int) -> list[tuple[int, int]]:
    """Run the warm-up steps on `runner` (a ModelRunner with its pool built) and wait for them;
    returns their shapes. Sizes are capped by what the runner's buffers and page table hold."""
    table = runner.page_table
    max_len = table.table.shape[1] * runner.page_size
    tokens = min(budget, runner.buffers.max_tokens, WARMUP_MAX_TOKENS)
    shapes = warmup_shapes(tokens, max_len, min(max_requests, runner.buffers.max_batch - 1))
    for requests, length in shapes:
        runner.forward(padding_step(table.padding_row, requests, length))
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    return shapes


def timed_warm_up(runner, budget: int, max_requests: int) -> tuple[list[tuple[int, int]], float]:
    start = time.perf_counter()
    shapes = warm_up(runner, budget, max_requests)
    return shapes, time.perf_counter() - start
