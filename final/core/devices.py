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
