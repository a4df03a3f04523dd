"""Attention backends, chosen by name: `--attn torch`, `--attn fi`, or `--attn PREFILL,DECODE`."""

from __future__ import annotations

import torch

from stages.common.errors import UserError

from .base import AttentionBackend, HybridBackend

BACKENDS = ("torch", "fi")
HALF_DTYPES = (torch.float16, torch.bfloat16)  # FlashInfer has no float32 kernels


def _create_one(name: str, config, pool, page_table) -> AttentionBackend:
    if name == "torch":
        from .torch_backend import TorchBackend

        return TorchBackend(config, pool, page_table)
    if name == "fi":
        from .flashinfer_backend import FlashInferBackend

        return FlashInferBackend(config, pool, page_table)
    raise UserError(f"unknown attention backend {name!r}; choose from {', '.join(BACKENDS)} or auto")


def resolve_names(spec: str, device_type: str, dtype: torch.dtype | None = None) -> tuple[str, str]:
    """'fi' -> ('fi', 'fi'); 'torch,fi' -> ('torch', 'fi'); 'auto' -> fi on CUDA when installed
    and the dtype is half precision, else torch. `dtype` None: not known yet, not checked."""
    half = dtype is None or dtype in HALF_DTYPES
    if spec == "auto":
        if device_type != "cuda" or not half:
            return "torch", "torch"
        try:
            import flashinfer  # noqa: F401
        except ImportError:
            return "torch", "torch"
        return "fi", "fi"
    names = [n.strip() for n in spec.split(",")]
    if len(names) not in (1, 2) or not all(names):
        raise UserError(f"--attn takes NAME or PREFILL,DECODE, got {spec!r}")
    if "fi" in names and device_type != "cuda":  # the same words as final/attention
        raise UserError("--attn fi runs on CUDA GPUs only; use --attn torch on the CPU")
    if "fi" in names and not half:
        raise UserError(f"--attn fi needs --dtype bfloat16 or float16 (FlashInfer has no {dtype} kernels); "
                        "use --attn torch for float32")  # fmt: skip
    return names[0], names[-1]


def create_backend(spec: str, config, pool, page_table) -> AttentionBackend:
    prefill, decode = resolve_names(spec, pool.k.device.type, pool.k.dtype)
    if prefill == decode:
        return _create_one(prefill, config, pool, page_table)
    return HybridBackend(
        _create_one(prefill, config, pool, page_table), _create_one(decode, config, pool, page_table)
    )


__all__ = ["AttentionBackend", "BACKENDS", "create_backend", "resolve_names"]
