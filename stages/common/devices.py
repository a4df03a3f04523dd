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


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that host clocks measure it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --8<-- [start:copies]
def to_device(values: list, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A host list as a tensor on `device`, without making the host wait for the GPU.

    `torch.tensor(values, device="cuda")` copies with non_blocking=False, which waits for every
    kernel already queued on the stream: one step's worth of GPU time. Through pinned (page-locked)
    memory the copy is queued like a kernel and the host moves on; PyTorch's caching host allocator
    keeps the pinned block until the copy has run, so the host may build the next one at once."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """Start copying a GPU tensor into pinned host memory and return the host tensor, to be read
    only once an event recorded after this call has completed (on a CPU: the tensor itself)."""
    if tensor.device.type != "cuda":
        return tensor
    out = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return out.copy_(tensor, non_blocking=True)


# --8<-- [end:copies]
