"""Fused kernels where FlashInfer has them, and the torch code they replace.

A decoder layer written op by op launches dozens of small kernels (RMSNorm alone is a cast, a
square, a mean, an rsqrt, two multiplies and a cast back); at decode batch sizes each of them
moves a few kilobytes and costs mostly its launch. FlashInfer fuses each group into one kernel:

    rms_norm       x / rms(x) * w                       one pass (also per head, for Qwen3's q/k norm)
    add_rms_norm   r = x + r; x = r / rms(r) * w         the residual add fused into the next norm
    silu_and_mul   silu(gate) * up                       on the merged gate/up output
    apply_rope     rotate q and k in place               from one cos/sin table, all heads at once

The torch versions (`torch_*`) are the reference: they run on the CPU, for float32, and when
FlashInfer is not installed, and the GPU tests check the kernels against them on random inputs.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch
import torch.nn.functional as F

HALF = (torch.float16, torch.bfloat16)  # FlashInfer's kernels are half precision only


@functools.cache
def _flashinfer() -> ModuleType | None:
    try:
        import flashinfer
    except ImportError:
        return None
    return flashinfer


def use_kernels(x: torch.Tensor) -> bool:
    """Whether the fused kernels serve this tensor: a CUDA half-precision tensor, FlashInfer installed."""
    return x.is_cuda and x.dtype in HALF and _flashinfer() is not None


# ---------------------------------------------------------------------------------------- torch


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Normalise in float32 even for bf16 activations: the mean of squares loses too much in bf16.
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def torch_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    summed = x + residual
    return torch_rms_norm(summed, weight, eps), summed


def torch_silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def torch_apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, heads, dim] and k [T, kv_heads, dim] by the angles of `positions` [T];
    `cos_sin` [max positions, dim] holds cos in its first half and sin in its second."""
    cos, sin = cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        first, second = x.float().chunk(2, dim=-1)
        out = torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
        return out.to(x.dtype)

    return rotate(q), rotate(k)


# ------------------------------------------------------------------------------ dispatch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., dim] normalised over its last dimension (2-D: rows; 3-D: each head of each token)."""
    fi = _flashinfer() if use_kernels(x) else None
    if fi is None or x.dim() not in (2, 3):
        return torch_rms_norm(x, weight, eps)
    return fi.norm.rmsnorm(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual). The kernel works in place: it overwrites both inputs."""
    fi = _flashinfer() if use_kernels(x) else None
    if fi is None or x.dim() != 2:
        return torch_add_rms_norm(x, residual, weight, eps)
    fi.norm.fused_add_rmsnorm(x, residual, weight, eps)
    return x, residual


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    fi = _flashinfer() if use_kernels(gate_up) else None
    if fi is None:
        return torch_silu_and_mul(gate_up)
    return fi.activation.silu_and_mul(gate_up)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rotated; the kernel rotates them in place (its input must be float32 cos/sin)."""
    fi = _flashinfer() if use_kernels(q) else None
    if fi is None:
        return torch_apply_rope(q, k, positions, cos_sin)
    head_dim = q.shape[-1]
    fi.rope.apply_rope_with_cos_sin_cache_inplace(
        positions, q.view(q.shape[0], -1), k.view(k.shape[0], -1), head_dim, cos_sin, is_neox=True
    )
    return q, k
