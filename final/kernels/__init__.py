"""Our own GPU kernels (Triton) and the FlashInfer calls the engine makes outside attention, each
beside the torch code it replaces.

    kv_write.py         K and V of a step's tokens into the paged pool: one kernel a layer
    qk_norm_rope_kv.py  Qwen3's per-head q/k RMSNorm, RoPE and the K/V write: one kernel a layer
    sampling.py         FlashInfer's sampling kernels with per-row parameters
    step_metadata.py    a decode step's inputs and slots, and the attention plan's page list
    gemv.py             small-batch linear layers (decode at batch 1-4) that read weights faster
                        than cuBLAS does at those shapes

Every file holds the torch reference (what runs on the CPU, for float32, and where Triton or
FlashInfer is missing), the kernel, and a dispatch that picks one. The references are what the
tests compare the kernels with: on a GPU (tests/final/kernels/test_final_gpu_kernels.py,
scripts/bench_kernels.py) and on the CPU through Triton's interpreter
(tests/final/kernels/test_final_kernels_interpret.py).

Triton is imported only when a kernel is first built (`triton_available`, the `_jit` builders):
a CPU install may not have it, and importing it costs start-up time the CLI should not pay.
"""

from __future__ import annotations

import functools
import os

import torch

HALF = (torch.float16, torch.bfloat16)


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        return False
    return True


def use_triton(x: torch.Tensor) -> bool:
    """Whether our Triton kernels serve this activation: a CUDA half-precision tensor, Triton installed."""
    return x.is_cuda and x.dtype in HALF and triton_available()


@functools.cache
def pdl_available(device: torch.device) -> bool:
    """Whether our Triton kernels may use programmatic dependent launch (PDL) on this GPU: Hopper or
    later (compute capability 9+), and a Triton that has both the launch option and the in-kernel
    wait (`gdc_wait`). With PDL a kernel may start while the one before it on the stream finishes,
    and waits inside, at `gdc_wait`, before it reads what that kernel wrote. `FINAL_PDL=0` in the
    environment turns it off, to measure what it buys (`FINAL_PDL=0 bash scripts/gpu_run.sh versus`)."""
    if os.environ.get("FINAL_PDL", "1") == "0":
        return False
    if not triton_available() or torch.cuda.get_device_capability(device)[0] < 9:
        return False
    import dataclasses

    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
    except ImportError:
        return False
    return any(f.name == "launch_pdl" for f in dataclasses.fields(CUDAOptions))


def use_pdl(x: torch.Tensor) -> bool:
    """Programmatic dependent launch for a kernel on this tensor's GPU (pdl_available)."""
    return x.is_cuda and pdl_available(x.device)


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()
