"""Choosing a device and a dtype from what the user asked for and what the machine has."""

from __future__ import annotations

import torch

from .errors import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("--device cuda asked for, but PyTorch sees no CUDA GPU")
    if name.split(":")[0] not in ("cpu", "cuda"):
        raise UserError(f"unknown device {name!r}; use cpu, cuda or auto")
    return torch.device(name)


def pick_dtype(name: str, checkpoint_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """`auto`: float32 on the CPU (bf16 matmuls are slow there); on a GPU the checkpoint's dtype,
    or bfloat16 when the checkpoint is float32 (half the memory traffic, same exponent range)."""
    if name != "auto":
        if name not in DTYPES:
            raise UserError(f"unknown dtype {name!r}; use auto, {', '.join(DTYPES)}")
        return DTYPES[name]
    if device.type == "cpu":
        return torch.float32
    return checkpoint_dtype if checkpoint_dtype in (torch.bfloat16, torch.float16) else torch.bfloat16


# --kv-cache-dtype's names (core/config.py's KV_CACHE_DTYPES, but `auto`: the model's dtype).
KV_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn}


def pick_kv_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """The KV pool's dtype for `--kv-cache-dtype name` when the model computes in `dtype`."""
    if name == "auto":
        return dtype
    if name not in KV_TORCH_DTYPES:
        raise UserError(f"unknown --kv-cache-dtype {name!r}; use auto, {', '.join(KV_TORCH_DTYPES)}")
    return KV_TORCH_DTYPES[name]


def kv_dtype_name(kv_dtype: torch.dtype) -> str:
    """The --kv-cache-dtype name of a pool dtype (`bf16`, `fp8_e4m3`), or torch's name of it."""
    names = {dtype: name for name, dtype in KV_TORCH_DTYPES.items()}
    return names.get(kv_dtype, str(kv_dtype).removeprefix("torch."))
