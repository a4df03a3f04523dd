"""Linear layers at decode batch sizes: y = x W^T (+ b) for a handful of rows x, read at the speed of
memory.

With one to four tokens a decode step's matmuls are matrix-vector products: all the time goes to
reading W once. cuBLAS tiles the output, so an output of 1,024 features (Qwen3-0.6B's o_proj and
down_proj) keeps a few tiles' worth of SMs busy and reads W at 0.3-0.6 TB/s on an H200 (issue 31:
o_proj 13.9 us, down_proj 10.5 us). Here each program reads BLOCK_N whole rows of W, so even
N = 1,024 rows make hundreds of programs and every SM streams its share; the x rows are reloaded
by every program, from L2. Splitting K over programs as well (split-K) would need a second kernel
or atomics to add the partial sums, and rows alone already give enough programs for these shapes.

On Hopper the kernel is launched with programmatic dependent launch (PDL): its programs may start
while the kernel before it (a norm, the activation, attention's merge) is still finishing, load
their first tile of W, which no kernel writes, and only then wait (`gdc_wait`) for x. A decode
step at batch 1 is about three hundred short kernels one after another; the GPU's time between
them was the 13% of the H100's batch-1 step that was no kernel at all (issue 31), and these GEMVs
are a third of the kernels. FlashInfer launches its norm and activation kernels the same way.

Used only below a measured batch size, which depends on the output's width (`gemv_max_m`): with
few output features cuBLAS has few tiles to spread and the kernel wins up to 4 rows; with many it
wins at one row only. Measured on an H200 (benchmarks/results/h200/kernels_h200.json, the `gemv`
rows; scripts/bench_kernels.py prints the thresholds it finds) at Qwen3-0.6B's shapes, cuBLAS
against the kernel, µs at M = 1: o_proj 10.5 / 2.3, down_proj 7.1 / 3.1, qkv 4.0 / 3.4, gate_up
5.1 / 3.7, the LM head 77.6 / 71.5; the kernel still won at M = 4 on o_proj and down_proj, at
M = 2 on qkv, and lost at M = 2 on gate_up and the LM head.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F

from . import next_power_of_2, use_pdl, use_triton

# (largest output width, largest token count that takes the kernel there), narrowest first: where
# the kernel beat cuBLAS on the H200 (see above). Wider than the last entry: cuBLAS always.
GEMV_MAX_M_BY_WIDTH: tuple[tuple[int, int], ...] = ((2048, 4), (4096, 2), (1 << 20, 1))
# Tiles that beat the default at M = 1 on the H200 (the `best_config` of the `gemv` rows), by
# (N, K): Qwen3-0.6B's qkv_proj, gate_up_proj, down_proj and LM head.
MEASURED_CONFIGS: dict[tuple[int, int], tuple[int, int, int]] = {
    (4096, 1024): (2, 1024, 4),
    (6144, 1024): (8, 512, 4),
    (1024, 3072): (1, 4096, 4),
    (151936, 1024): (2, 1024, 4),
}


def gemv_max_m(n: int) -> int:
    """The most rows x may have for the kernel to serve an output of n features (0: never)."""
    return next((m for width, m in GEMV_MAX_M_BY_WIDTH if n <= width), 0)


class GemvConfig(NamedTuple):
    block_n: int  # rows of W a program reads
    block_k: int  # columns per loop step
    num_warps: int


def default_config(m: int, n: int, k: int) -> GemvConfig:
    """A tile of about 4,096 weights (32 a thread at 4 warps), as much of K as that allows, so that
    most rows take a single loop step with all their loads in flight at once; 2 rows a program up
    to N = 2,048 (at least 512 programs for N = 1,024), 4 above (x is reloaded per program). At one
    row, the tile measured fastest for the shape if there is one (MEASURED_CONFIGS)."""
    if m == 1 and (n, k) in MEASURED_CONFIGS:
        return GemvConfig(*MEASURED_CONFIGS[n, k])
    block_n = 2 if n <= 2048 else 4
    return GemvConfig(block_n, min(next_power_of_2(k), 4096 // block_n), 4)


def torch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, weight, bias)


@functools.cache
def _jit():
    """The Triton kernel, built on first use."""
    import triton
    import triton.language as tl

    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    except ImportError:  # an older Triton: PDL stays off (pdl_available), the branch never compiles
        gdc_launch_dependents = gdc_wait = None

    @triton.jit
    def gemv_kernel(
        x,
        w,
        bias,
        y,
        M,
        N,
        x_row_stride,
        w_row_stride,
        y_row_stride,
        K: tl.constexpr,  # a compile-time constant: a handful of shapes, and a loop of known length
        HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        PDL: tl.constexpr,  # launched with programmatic dependent launch: wait before reading x
    ):
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        m = tl.arange(0, BLOCK_M)
        n_in = n < N
        w_rows = w + n.to(tl.int64)[:, None] * w_row_stride
        # The first tile of W, loaded before anything the previous kernel wrote is read: under PDL
        # this load overlaps that kernel's end. x (and y, which may reuse memory it still reads)
        # only after the wait; then the next kernel may start launching too.
        tile = tl.load(
            w_rows + tl.arange(0, BLOCK_K)[None, :],
            mask=n_in[:, None] & (tl.arange(0, BLOCK_K) < K)[None, :],
            other=0.0,
        )
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, K, BLOCK_K):
            col = start + tl.arange(0, BLOCK_K)
            col_in = col < K
            if start > 0:  # the first tile is in hand already
                tile = tl.load(w_rows + col[None, :], mask=n_in[:, None] & col_in[None, :], other=0.0)
            w_tile = tile.to(tl.float32)  # [BLOCK_N, BLOCK_K]
            for row in tl.static_range(BLOCK_M):  # a few rows: one dot product each, no 3-D temporaries
                row_in = (
                    tl.full([BLOCK_K], row, tl.int32) < M
                )  # a vector mask: Triton 3.9's interpreter refuses a scalar one
                xs = tl.load(x + row * x_row_stride + col, mask=col_in & row_in, other=0.0)
                part = tl.sum(w_tile * xs.to(tl.float32)[None, :], axis=1)  # [BLOCK_N]
                acc += tl.where(m[:, None] == row, part[None, :], 0.0)
        if HAS_BIAS:
            acc += tl.load(bias + n, mask=n_in, other=0.0).to(tl.float32)[None, :]
        out = y + m[:, None] * y_row_stride + n[None, :]
        tl.store(out, acc.to(y.dtype.element_ty), mask=(m < M)[:, None] & n_in[None, :])

    return gemv_kernel


def triton_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: GemvConfig | None = None,
    pdl: bool | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The kernel: x [M, K] (M small), weight [N, K], bias [N] -> [M, N] in x's dtype, into `out`
    where given (rows of unit stride). `pdl`: launch with programmatic dependent launch (default:
    where the GPU and Triton have it)."""
    m, k = x.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and weight.stride(1) == 1, "W must be row-major [N, K]"
    if x.stride(1) != 1:
        x = x.contiguous()
    if out is not None:
        assert out.shape == (m, n) and out.dtype == x.dtype and out.stride(1) == 1, "out must be [M, N] rows"
    y = torch.empty(m, n, dtype=x.dtype, device=x.device) if out is None else out
    if m == 0:
        return y
    config = config or default_config(m, n, k)
    pdl = use_pdl(x) if pdl is None else pdl
    grid = (-(-n // config.block_n),)
    launch = {"launch_pdl": True} if pdl else {}  # an option only a CUDA launch knows
    _jit()[grid](
        x,
        weight,
        bias if bias is not None else weight,  # not read without a bias
        y,
        m,
        n,
        x.stride(0),
        weight.stride(0),
        y.stride(0),
        K=k,
        HAS_BIAS=bias is not None,
        BLOCK_M=next_power_of_2(m),
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        PDL=pdl,
        num_warps=config.num_warps,
        **launch,
    )
    return y


def use_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        x.dim() == 2
        and 0 < x.shape[0] <= gemv_max_m(weight.shape[0])
        and weight.dtype == x.dtype
        and weight.stride(1) == 1
        and use_triton(x)
    )


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """F.linear, through the GEMV kernel where it was measured faster (see gemv_max_m); written
    into `out` where given (a decode graph's logits buffer: no copy of [batch, vocab] after)."""
    if use_gemv(x, weight):
        return triton_linear(x, weight, bias, out=out)
    if out is None:
        return F.linear(x, weight, bias)
    if bias is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(bias, x, weight.t(), out=out)
