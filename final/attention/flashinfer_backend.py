"""FlashInfer's paged attention kernels: one batched prefill or decode call per layer.

The kernels read K and V straight from the pages, so nothing is gathered. Planning (splitting
the work over thread blocks for this batch's lengths) happens once per step in `prepare` from
host-side lengths (O(batch) host work); every layer then reuses the plan.

Under CUDA graphs each captured batch size gets its own decode wrapper in FlashInfer's graph
mode: its page list, page pointers and last-page lengths live in fixed buffers (shared by every
size, since one graph replays at a time), and `prepare_for_replay` re-plans into them before
each replay.

An FP8 pool (--kv-cache-dtype fp8_e4m3) is planned with kv_data_type float8_e4m3fn beside the
model's query dtype, and each layer's run gets its scales: FlashInfer folds k_scale into the
softmax scale and multiplies the output by v_scale (FlashInfer 0.7.2, decode.py and prefill.py,
`run`). Decode then always takes the tensor-core kernel: with an fp8 cache it measured faster
than the CUDA-core one at every shape of issue 32 (H200, Qwen3-0.6B heads, page 16).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from itertools import accumulate

import torch

from ..core.errors import UserError
from ..core.flags import env_count
from ..core.forward_batch import ForwardBatch
from ..kernels import step_metadata
from .base import AttentionBackend

WORKSPACE_BYTES = 128 * 1024 * 1024
# Decode steps of at least this many rows whose mean context is at least TENSOR_CORE_MIN_CONTEXT
# tokens take FlashInfer's tensor-core decode even when few query heads share a KV head (Qwen3-0.6B:
# 2); None: never. Chosen by `gpu_run.sh tc-ab` on an H200 (session 16,
# benchmarks/results/h200/final_offline_tc*_h200.json, every context then): the offline workload,
# whose decode steps run long contexts, gained about 6% from a bound of 64 or 32 (within 0.2% of
# each other) against never, 4% from 128, a little less from 16 or 1; each arm's two runs within
# 0.2%. The context bound: scripts/bench_kernels.py's `decode_attn_tc` rows (kernels_h200.json, one
# layer's kernel) have the CUDA-core kernel faster at 512 tokens at batch 64 and 256 (by 5% and 3%),
# tensor cores faster at 1,024 at 256 (4%), at 4,096 at both; at batch 1 the CUDA-core kernel was
# never slower. Session 17 measured the bound (same files, `_ctx<N>`; versus_minisgl_h200.json):
# offline, any context 24,236 tok/s, from 768 tokens 23,934, from 1,024 23,190; but with any context
# the kernel table's batch-256 step (512-token contexts) spent 14% more in attention than
# Mini-SGLang's, and from 768 it spends about as much (1% more). 768 keeps both goals.
TENSOR_CORE_MIN_BATCH: int | None = 64
TENSOR_CORE_MIN_CONTEXT = 768
# Steps of TENSOR_CORE_MIN_BATCH rows or more whose contexts spread this much (their standard
# deviation over their mean, in percent) take tensor cores at any mean context; None: the spread
# does not count. Session 18's `gpu_run.sh decode-attn` (one layer's kernel, as the graphs run it,
# benchmarks/logs/h200x4-2026-11-28-s18/kernels_decode_attn_h200.json): at batch 256 the tensor-core
# kernel is slower at an even 512 tokens a row (the kernel table's step), faster at 512 on average
# spread from 64 to 960 (a spread of about 50%) and at 768 spread from 256 to 1,280 (about 38%),
# as in the offline workload, whose steps took tensor cores at any context 1.3% faster than from 768
# (session 17). 25% from `tc-ab` end to end on the H200 (sessions 19-20, offline, two runs an arm, in
# three calls): 1.7%, 2.4% and 3.1% more tok/s than without it; `versus` with it kept the kernel
# table's batch-256 attention within 1% of Mini-SGLang's (its even contexts have no spread).
TENSOR_CORE_MIN_SPREAD: int | None = 25
TENSOR_CORE_ENV = "FINAL_TC_MIN_BATCH"  # overrides it for an A/B (gpu_run.sh tc-ab); 0: never
TENSOR_CORE_CONTEXT_ENV = "FINAL_TC_MIN_CONTEXT"  # overrides the context bound; 0: any context
TENSOR_CORE_SPREAD_ENV = "FINAL_TC_MIN_SPREAD"  # overrides the spread bound (percent); 0: off


@functools.cache
def tensor_core_bounds() -> tuple[int | None, int, int | None]:
    """(TENSOR_CORE_MIN_BATCH, TENSOR_CORE_MIN_CONTEXT, TENSOR_CORE_MIN_SPREAD), or what
    FINAL_TC_MIN_BATCH, FINAL_TC_MIN_CONTEXT and FINAL_TC_MIN_SPREAD say (read once: they are
    asked every decode step)."""
    batch = env_count(TENSOR_CORE_ENV, "a batch size (0: never)")
    context = env_count(TENSOR_CORE_CONTEXT_ENV, "a number of tokens (0: any context)")
    spread = env_count(TENSOR_CORE_SPREAD_ENV, "a percentage (0: the spread does not count)")
    return (
        TENSOR_CORE_MIN_BATCH if batch is None else batch or None,
        TENSOR_CORE_MIN_CONTEXT if context is None else context,
        TENSOR_CORE_MIN_SPREAD if spread is None else spread or None,
    )


def mean_context(batch: ForwardBatch) -> float:
    """A decode step's KV tokens per row: what the two decode kernels' speeds turn on."""
    return sum(batch.seq_lens) / max(batch.size, 1)


def context_spread(seq_lens: list[int]) -> float:
    """How unevenly a step's contexts are spread: their standard deviation over their mean, in
    percent (0 for rows of one length)."""
    n = len(seq_lens)
    mean = sum(seq_lens) / max(n, 1)
    if mean == 0:
        return 0.0
    variance = sum((x - mean) ** 2 for x in seq_lens) / n
    return 100.0 * variance**0.5 / mean


def pinned_int32(values: list[int], pin: bool = True) -> torch.Tensor:
    """A host tensor for plan(), which reads it on the host and copies it to the device without
    blocking. In pinned memory: a copy from pageable memory may first synchronize with the stream
    (CUDA's API synchronization behavior), and under overlap scheduling that stream is still running
    the step in flight, so the host would wait for it and the GPU would then wait for the host.
    PyTorch's caching host allocator keeps the block until the copy has run. (`pin` False: a host
    with no GPU, where scripts/bench_host_step.py runs this backend over a stand-in FlashInfer.)"""
    return torch.tensor(values, dtype=torch.int32, pin_memory=pin)


class FlashInferBackend(AttentionBackend):
    name = "fi"

    def __init__(self, config, pool, page_table, num_heads=None, library=None):
        super().__init__(config, pool, page_table, num_heads)
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
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.group = self.num_heads // pool.kv_heads
        # One eager decode wrapper per kernel kind (tensor cores or not), made when first needed.
        self.decode_wrappers: dict[bool, object] = {}
        self.decode_wrapper = self._decode_wrapper(self.use_tensor_cores(1, 0))
        self.current = self.decode_wrapper  # the decode wrapper the next forward uses
        # Each layer's run() arguments for an FP8 pool's scales (none for a pool of the model's dtype).
        layers = [pool.layer_kv(n) for n in range(config.num_layers)]
        self.scales = [{"k_scale": c.k_scale, "v_scale": c.v_scale} if pool.is_fp8 else {} for c in layers]
        self.last_plan: torch.cuda.Event | None = None
        self.graph_wrappers: dict[tuple[int, bool], object] = {}  # (size, tensor cores) -> wrapper
        self.graph_buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def _plan(self, wrapper, batch: ForwardBatch, graphed: bool = False) -> None:
        # plan() writes its metadata into a pinned host buffer of the wrapper and copies it to the
        # device asynchronously. With overlap scheduling the host plans step N+1 while step N may
        # not have run that copy yet: wait for it first (it is almost always done already).
        if self.last_plan is not None:
            self.last_plan.synchronize()
        self._plan_now(wrapper, batch, graphed)
        self.last_plan = torch.cuda.Event()
        self.last_plan.record()

    def _plan_now(self, wrapper, batch: ForwardBatch, graphed: bool) -> None:
        page_size, pin = self.pool.page_size, self.workspace.is_cuda
        num_pages_list = [-(-n // page_size) for n in batch.seq_lens]
        kv_indptr_list = [0, *accumulate(num_pages_list)]
        kv_indptr = pinned_int32(kv_indptr_list, pin)
        last_page_len = pinned_int32(
            [n - (p - 1) * page_size for n, p in zip(batch.seq_lens, num_pages_list, strict=True)], pin
        )
        # The page list of every request, gathered on the device from the page table in one kernel;
        # a graph wrapper's is written straight into its fixed buffer (plan's copy is then a no-op).
        graph_indices = self.graph_buffers[1] if graphed and self.graph_buffers is not None else None
        kv_indices = step_metadata.kv_indices(
            self.page_table.table,
            batch.rows,
            batch.seq_lens_t,
            page_size,
            kv_indptr_list[-1],
            max(num_pages_list),
            graph_indices,
        )
        c, dtype, kv_dtype = self.config, self.pool.compute_dtype, self.pool.dtype
        heads, kv_heads = self.num_heads, self.pool.kv_heads
        if batch.is_prefill:
            qo_indptr = pinned_int32([0, *accumulate(batch.query_lens)], pin)
            wrapper.plan(
                qo_indptr,
                kv_indptr,
                kv_indices,
                last_page_len,
                heads,
                kv_heads,
                c.head_dim,
                page_size,
                causal=True,
                q_data_type=dtype,
                kv_data_type=kv_dtype,
                # The lengths it would otherwise derive into a pageable tensor and copy from there.
                seq_lens=pinned_int32(batch.seq_lens, pin),
            )
        else:
            wrapper.plan(
                kv_indptr,
                kv_indices,
                last_page_len,
                heads,
                kv_heads,
                c.head_dim,
                page_size,
                pos_encoding_mode="NONE",
                q_data_type=dtype,
                kv_data_type=kv_dtype,
            )

    def use_tensor_cores(
        self, batch_size: int, context: float, spread: Callable[[], float] = lambda: 0.0
    ) -> bool:
        """FlashInfer's decode on tensor cores (its prefill kernel with one query per request) or
        on CUDA cores, for a step of `batch_size` rows of `context` KV tokens each on average.
        Tensor cores pay off once several query heads share a KV head (4 or more); groups that are
        not a power of two (SmolLM2: 3) take them too: the path the GPU tests ran for that layout.
        An FP8 pool always does (issue 32's H200 table: tensor cores were faster at every shape
        measured there). Smaller groups from TENSOR_CORE_MIN_BATCH rows and TENSOR_CORE_MIN_CONTEXT
        tokens on, or contexts spread by TENSOR_CORE_MIN_SPREAD percent, as measured (above);
        `spread` computes it (a pass over the rows), called only where it decides."""
        group = self.group
        if self.pool.is_fp8 or group >= 4 or group & (group - 1) != 0:
            return True
        min_batch, min_context, min_spread = tensor_core_bounds()
        if min_batch is None or batch_size < min_batch:
            return False
        return context >= min_context or (min_spread is not None and spread() >= min_spread)

    def graph_variants(self, size: int) -> tuple[bool, ...]:
        """Whether each decode graph of `size` rows runs on tensor cores: a graph for each kernel a
        step of that size may take, which is two where its context decides."""
        short, long = self.use_tensor_cores(size, 0), self.use_tensor_cores(size, math.inf)
        return (short,) if short == long else (short, long)

    def graph_variant(self, batch: ForwardBatch) -> bool:
        return self.use_tensor_cores(batch.size, mean_context(batch), lambda: context_spread(batch.seq_lens))

    def _decode_wrapper(self, tensor_cores: bool):
        if tensor_cores not in self.decode_wrappers:
            self.decode_wrappers[tensor_cores] = self.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_tensor_cores=tensor_cores
            )
        return self.decode_wrappers[tensor_cores]

    def prepare(self, batch: ForwardBatch) -> None:
        if batch.is_prefill:
            self._plan(self.prefill_wrapper, batch)
        else:
            self.current = self._decode_wrapper(self.graph_variant(batch))
            self._plan(self.current, batch)

    def _graph_wrapper(self, size: int, tensor_cores: bool):
        """The graph-mode decode wrapper of one captured batch size and kernel (made at its capture)."""
        if (size, tensor_cores) not in self.graph_wrappers:
            if self.graph_buffers is None:
                # Sized for the largest batch the page table can hold, every page of every row.
                rows, width = self.page_table.table.shape
                device = self.workspace.device
                self.graph_buffers = (
                    torch.zeros(rows + 1, dtype=torch.int32, device=device),
                    torch.zeros(rows * width, dtype=torch.int32, device=device),
                    torch.zeros(rows, dtype=torch.int32, device=device),
                )
            indptr, indices, last_page_len = self.graph_buffers
            wrapper = self.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=tensor_cores,
                paged_kv_indptr_buffer=indptr[: size + 1],
                paged_kv_indices_buffer=indices,
                paged_kv_last_page_len_buffer=last_page_len[:size],
            )
            self.graph_wrappers[size, tensor_cores] = wrapper
        return self.graph_wrappers[size, tensor_cores]

    def graph_unsupported_reason(self, max_batch: int) -> str | None:
        return None

    def _graph_kernel(self, batch: ForwardBatch, variant: object) -> bool:
        """Tensor cores or not for a graph of this batch: `variant` where given, else as picked."""
        return self.graph_variant(batch) if variant is None else bool(variant)

    def prepare_for_capture(self, batch: ForwardBatch, variant: object = None) -> None:
        self.current = self._graph_wrapper(batch.size, self._graph_kernel(batch, variant))
        self._plan(self.current, batch, graphed=True)

    def prepare_for_replay(self, batch: ForwardBatch, variant: object = None) -> None:
        self.current = self.graph_wrappers[batch.size, self._graph_kernel(batch, variant)]
        self._plan(self.current, batch, graphed=True)

    def forward(self, layer, q, k, v, batch, out=None):
        self.write_kv(layer, k, v, batch)
        wrapper = self.prefill_wrapper if batch.is_prefill else self.current
        v_cache = self.pool.v[layer]
        # Our own output buffer: without one, FlashInfer 0.7's prefill `run` allocates it with
        # torch.zeros, a fill kernel per layer over [tokens, heads, head_dim] that the kernel then
        # overwrites (28 fills, 0.58 ms of GPU time in a 16,384-token prefill step on the H100:
        # benchmarks/logs/h100-2026-11-27-s9/prefill_kernels_final.json).
        if out is None:
            out = q.new_empty((*q.shape[:-1], v_cache.shape[-1]))
        out = wrapper.run(q, (self.pool.k[layer], v_cache), out=out, **self.scales[layer])
        return out.reshape(q.shape[0], -1)
