"""Choosing a device and a dtype from what the user asked for and what the machine has."""

from __future__ import annotations

import os

import torch

from .errors import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's and SGLang's other names


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
    name = DTYPE_ALIASES.get(name, name)
    if name != "auto":
        if name not in DTYPES:
            raise UserError(f"unknown dtype {name!r}; use auto, {', '.join(DTYPES)}")
        return DTYPES[name]
    if device.type == "cpu":
        return torch.float32
    return checkpoint_dtype if checkpoint_dtype in (torch.bfloat16, torch.float16) else torch.bfloat16


def usable_cpus() -> int:
    """CPUs this process may run on (a container's or taskset's limit, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_threads(requested: int | None = None, ranks: int = 1) -> int | None:
    """PyTorch threads for a CPU engine (each of `ranks` processes sharing this machine): `requested`
    (--threads) when given; None when OMP_NUM_THREADS is set (PyTorch read it: that choice stands);
    else the usable CPUs less one, shared among the ranks. PyTorch's default is one per core, and
    its threads wait for one another at the end of every op: where anything else runs (a server's
    frontend, the OS, another user), one of them is descheduled and every op waits for it: on a
    shared 2-core machine stage 01 decoded several times slower with two threads than with one. A
    core left free absorbs the rest of the machine, at the cost of one core's share on an idle one."""
    if requested is not None:
        return requested
    if "OMP_NUM_THREADS" in os.environ:
        return None
    return max(1, (usable_cpus() - 1) // ranks)


def set_cpu_threads(requested: int | None = None, ranks: int = 1) -> str:
    """Apply `cpu_threads` to this process; return the start-up line that says what it chose."""
    threads = cpu_threads(requested, ranks)
    per = " per rank" if ranks > 1 else ""
    if threads is None:
        return f"CPU: {torch.get_num_threads()} PyTorch threads{per} (OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']})"
    torch.set_num_threads(threads)
    why = "--threads" if requested is not None else f"{usable_cpus()} usable CPUs, one left free"
    return f"CPU: {threads} PyTorch thread{'s' if threads > 1 else ''}{per} ({why}; --threads N to change)"


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
