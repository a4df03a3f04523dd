"""Attention backends, chosen by name: `--attn NAME`, `--attn PREFILL,DECODE`, or `--attn auto`.

    torch    gathers pages and calls scaled_dot_product_attention; CPU and GPU; the reference
    fi       FlashInfer paged prefill and decode wrappers (flashinfer-python, CUDA)
    fa       FlashAttention 4 CuTe kernels (Hopper, Blackwell)            -- not ported yet
    trtllm   FlashInfer's TensorRT-LLM kernels (decode on Hopper+)         -- not ported yet

A new backend is a subclass of AttentionBackend (base.py) and one entry in BACKENDS.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..core.errors import NotAvailableYet, UserError
from ..core.model_config import ModelConfig
from ..kvcache import KVPool, PageTable
from .base import AttentionBackend, HybridBackend

HALF_DTYPES = (torch.float16, torch.bfloat16)  # FlashInfer has no float32 kernels
Factory = Callable[[ModelConfig, KVPool, PageTable, int], AttentionBackend]


def _torch(config: ModelConfig, pool: KVPool, page_table: PageTable, num_heads: int) -> AttentionBackend:
    from .torch_backend import TorchBackend

    return TorchBackend(config, pool, page_table, num_heads)


def _flashinfer(config: ModelConfig, pool: KVPool, page_table: PageTable, num_heads: int) -> AttentionBackend:
    from .flashinfer_backend import FlashInferBackend  # imports flashinfer only when asked for

    return FlashInferBackend(config, pool, page_table, num_heads)


# Registered so that `--attn fa` is a known name with a clear answer, not "unknown backend".
NOT_PORTED: dict[str, str] = {
    "fa": "FlashAttention 4",
    "trtllm": "the TensorRT-LLM kernels of FlashInfer",
}


def _not_ported_error(name: str) -> NotAvailableYet:
    return NotAvailableYet(
        f"--attn {name} ({NOT_PORTED[name]}) is not available in final/ yet; use --attn torch or fi"
    )


def _not_ported(name: str) -> Factory:
    def factory(config: ModelConfig, pool: KVPool, page_table: PageTable, num_heads: int) -> AttentionBackend:
        raise _not_ported_error(name)

    return factory


BACKENDS: dict[str, Factory] = {
    "torch": _torch,
    "fi": _flashinfer,
    **{name: _not_ported(name) for name in NOT_PORTED},
}


def _flashinfer_installed() -> bool:
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_names(spec: str, device_type: str, dtype: torch.dtype | None = None) -> tuple[str, str]:
    """'fi' -> ('fi', 'fi'); 'torch,fi' -> ('torch', 'fi'); 'auto' -> fi on CUDA when installed
    and the dtype is half precision, else torch. `dtype` None: not known yet, not checked.
    Once fa and trtllm are ported, auto picks by compute capability (fa,trtllm on Hopper)."""
    half = dtype is None or dtype in HALF_DTYPES
    if spec == "auto":
        if device_type == "cuda" and half and _flashinfer_installed():
            return "fi", "fi"
        return "torch", "torch"
    names = [n.strip() for n in spec.split(",")]
    if len(names) not in (1, 2) or not all(names):
        raise UserError(f"--attn takes NAME, PREFILL,DECODE or auto, got {spec!r}")
    for name in names:
        if name not in BACKENDS:
            raise UserError(f"unknown attention backend {name!r}; choose from {', '.join(BACKENDS)} or auto")
        if name in NOT_PORTED:
            raise _not_ported_error(name)
        if name == "fi" and device_type != "cuda":
            raise UserError("--attn fi runs on CUDA GPUs only; use --attn torch on the CPU")
        if name == "fi" and not half:
            raise UserError(
                f"--attn fi needs --dtype bfloat16 or float16 (FlashInfer has no {dtype} kernels); "
                "use --attn torch for float32"
            )
    return names[0], names[-1]


def create_backend(
    spec: str, config: ModelConfig, pool: KVPool, page_table: PageTable, num_heads: int | None = None
) -> AttentionBackend:
    """The backend(s) `spec` names; `num_heads`: query heads on this rank (default: all)."""
    prefill, decode = resolve_names(spec, pool.k.device.type, pool.k.dtype)
    heads = num_heads or config.num_heads
    if prefill == decode:
        return BACKENDS[prefill](config, pool, page_table, heads)
    return HybridBackend(
        BACKENDS[prefill](config, pool, page_table, heads), BACKENDS[decode](config, pool, page_table, heads)
    )


__all__ = ["AttentionBackend", "BACKENDS", "HybridBackend", "create_backend", "resolve_names"]
