"""A one-shot all-reduce for the small messages of a decode step, over NVLink (an A/B switch).

At batch 1, a tensor-parallel decode step of Qwen3-8B makes 73 all-reduces of 8 KB. NCCL's
ring and tree algorithms are built for bandwidth; for a message that small their fixed latency is
most of the cost, and on four H200s the 8B step at TP=2 stayed at 0.75 of its TP=1 step where
halving the weights alone would give about 0.5 (chapter 07, "Measure it"). Serving engines use an
all-reduce of their own there: every rank copies its part into a buffer that every other rank
of the node has mapped (CUDA IPC), and one kernel on each rank reads the others' parts over
NVLink and sums them, after a barrier made of flags in the same shared memory. This module uses
FlashInfer's port of vLLM's (`flashinfer.comm.vllm_ar`, `cuda_ipc`): plain CUDA IPC, no NVLink
multicast (which the lent hosts forbid; FlashInfer's TensorRT-LLM all-reduce workspace turns it on
by default).

`FINAL_CUSTOM_ALL_REDUCE=1` turns it on for the engine's ranks (one node, CUDA, 2, 4, 6 or 8
ranks); tensors up to MAX_BYTES take it, larger ones NCCL. Outside a graph a call copies its
tensor into this rank's shared buffer first. Inside a CUDA graph it reads the tensor where the
graph keeps it, and the peers' addresses of every such call are filled in after capture
(`register_graphs`, on every rank, after the last capture; the graphs' memory must then stay
allocated while the handle lives, which is why the graphs measured and dropped before the KV
cache is sized run NCCL: `paused`). Off until measured on GPUs (benchmarks/GPU_PLAN.md); the GPU
test compares TP with it against TP=1.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

ENV = "FINAL_CUSTOM_ALL_REDUCE"
MAX_BYTES = 8 << 20  # the largest message it takes: a batch-256 step's 2 MB fits, a long prefill's not
RANK_DATA_BYTES = 8 << 20  # the peers' addresses of every all-reduce recorded in a graph, 64 B each
CTAS = 36  # thread blocks a call: the kernel's own default (its authors' grid search)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DEGREES = (2, 4, 6, 8)  # the kernel's


def wanted(device: torch.device, size: int, nnodes: int) -> bool:
    """Whether the ranks build one: FINAL_CUSTOM_ALL_REDUCE=1, on GPUs, ranks of one node (CUDA
    IPC does not cross machines), a degree the kernel takes. Every rank answers the same."""
    if os.environ.get(ENV, "").strip() not in ("1", "on"):
        return False
    return device.type == "cuda" and nnodes == 1 and size in DEGREES


class OneShotAllReduce:
    """The shared buffers and FlashInfer's handle of one rank. Built and closed by every rank
    together (both exchange handles over `cpu_group`)."""

    def __init__(self, rank: int, size: int, device: torch.device, cpu_group, max_bytes: int = MAX_BYTES):
        from flashinfer.comm import cuda_ipc, vllm_ar  # FlashInfer only where the switch asks for it

        self.ipc, self.ar = cuda_ipc, vllm_ar
        self.rank, self.size, self.group, self.max_bytes = rank, size, cpu_group, max_bytes
        # The barrier's flags and the two-stage kernel's scratch: zeroed before anyone reads them.
        meta_bytes = vllm_ar.meta_size() + max_bytes
        self.meta = cuda_ipc.create_shared_buffer(meta_bytes, group=cpu_group)
        cuda_ipc.cudart.cudaMemset(ctypes.c_void_p(self.meta[rank]), 0, meta_bytes)
        self.buffers = cuda_ipc.create_shared_buffer(max_bytes, group=cpu_group)  # each rank's part
        torch.cuda.synchronize(device)
        dist.barrier(group=cpu_group)
        self.rank_data = torch.empty(RANK_DATA_BYTES, dtype=torch.uint8, device=device)
        self.handle = vllm_ar.init_custom_ar(self.meta, self.rank_data, rank, True)
        vllm_ar.register_buffer(self.handle, self.buffers)
        self.on = True

    def fits(self, x: torch.Tensor) -> bool:
        nbytes = x.numel() * x.element_size()
        sizes = x.dtype in DTYPES and x.is_contiguous() and 0 < nbytes <= self.max_bytes and nbytes % 16 == 0
        return self.on and sizes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's `x`, in a new tensor."""
        out = torch.empty_like(x)
        if torch.cuda.is_current_stream_capturing():  # `x` stays where the graph keeps it
            self.ar.all_reduce(self.handle, x, out, 0, 0, CTAS)
        else:  # copied into this rank's shared buffer, which the peers have mapped
            self.ar.all_reduce(self.handle, x, out, self.buffers[self.rank], self.max_bytes, CTAS)
        return out

    @contextmanager
    def paused(self) -> Iterator[None]:
        """NCCL for every all-reduce inside the block (graphs captured only to be measured)."""
        self.on = False
        try:
            yield
        finally:
            self.on = True

    def register_graphs(self) -> None:
        """After a capture, on every rank: the graphs' calls learn their peers' addresses."""
        handles, offsets = self.ar.get_graph_buffer_ipc_meta(self.handle)
        all_handles: list = [None] * self.size
        all_offsets: list = [None] * self.size
        dist.all_gather_object(all_handles, handles, group=self.group)
        dist.all_gather_object(all_offsets, offsets, group=self.group)
        self.ar.register_graph_buffers(self.handle, all_handles, all_offsets)

    def close(self) -> None:
        """Every rank together, with no kernel of it still running (the groups' barrier first)."""
        self.ar.dispose(self.handle)
        self.ipc.free_shared_buffer(self.buffers, self.group)
        self.ipc.free_shared_buffer(self.meta, self.group)
