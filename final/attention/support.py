"""What the machine offers an attention backend, checked against its descriptor (registry.py)
before the backend is built: a CUDA GPU of the right compute capability, a dtype its kernels
compute in, a KV-cache dtype they read, its kernel library, a page size and a head size it takes.
A machine that cannot run one gets a single message naming the package or the GPU it lacks (or,
for the cache, the backends that read it), never an ImportError or an assertion from inside a
kernel.
"""

from __future__ import annotations

import importlib.util

import torch

from ..core.devices import kv_dtype_name
from ..core.errors import UserError
from .registry import BACKENDS, kv_readers, reference_backend
from .spec import BackendSpec, Library

PHASES = ("prefill", "decode")


def is_cuda(device_type: str) -> bool:
    """Whether the fast backends can run on this device type (tests stand them in on the CPU)."""
    return device_type == "cuda"


def supports_dtype(spec: BackendSpec, dtype: torch.dtype) -> bool:
    """Whether the backend's kernels compute in `dtype` (tests stand them in for any dtype)."""
    return spec.dtypes is None or str(dtype).removeprefix("torch.") in spec.dtypes


def device_capability(device: torch.device | str) -> tuple[int, int] | None:
    """The compute capability of a CUDA device; None for any other device."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)


def installed(module: str) -> bool:
    """Whether `module` can be found, without importing it (its parent packages are imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing or broken
        return False


def missing_modules(library: Library) -> list[str]:
    return [module for module in library.modules if not installed(module)]


def _capability_text(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"


def pick_library(
    spec: BackendSpec,
    phase: str,
    device_type: str,
    capability: tuple[int, int] | None,
    dtype: torch.dtype | None,
) -> Library | None:
    """The library `--attn spec.name` runs `phase` on, or a UserError that says what is missing.
    `capability` None on CUDA: not known here (the frontend does not touch the GPU), not checked;
    `dtype` None: not known yet, not checked. None for a backend that needs no library."""
    name, libraries = spec.name, spec.libraries
    if not libraries:
        return None
    if not is_cuda(device_type):
        raise UserError(
            f"--attn {name} runs on CUDA GPUs only; use --attn {reference_backend().name} on the CPU"
        )
    if dtype is not None and not supports_dtype(spec, dtype):
        raise UserError(
            f"--attn {name} needs --dtype {' or '.join(spec.dtypes or ())} ({libraries[0].name} has no "
            f"{dtype} kernels); use --attn {reference_backend().name} for float32"
        )
    present = [lib for lib in libraries if not missing_modules(lib)]
    if not present:
        wanted = libraries[0]
        missing = missing_modules(wanted)
        found = "" if missing[0] == wanted.modules[0] else f" (module {missing[0]} not found)"
        raise UserError(
            f"--attn {name} needs {wanted.name}{found}: {wanted.install}; or use --attn {spec.alternative}"
        )
    if capability is None:
        return present[0]
    fits = [lib for lib in present if lib.runs(phase, capability[0])]
    if fits:
        return fits[0]
    gpu = f"compute capability {_capability_text(capability)}"
    decoders = [lib for lib in present if lib.prefill_note and lib.runs("decode", capability[0])]
    if phase == "prefill" and decoders:
        others = [s.name for s in BACKENDS.values() if s.name != name and not s.reference]
        hybrids = " or ".join(f"--attn {other},{name}" for other in others)
        raise UserError(
            f"--attn {name} cannot prefill on this GPU ({gpu}): {decoders[0].prefill_note}. "
            f"Use it for decode: {hybrids}"
        )
    options = "; ".join(f"{lib.name} needs {lib.gpus}: {lib.install}" for lib in libraries)
    have = ", ".join(lib.name for lib in present)
    raise UserError(f"--attn {name} cannot {phase} on this GPU ({gpu}) with {have}: {options}")


def check_page_size(name: str, library: Library | None, page_size: int) -> None:
    if library is None or library.takes_page_size(page_size):
        return
    hint = f"; {library.page_hint}" if library.page_hint else ""
    raise UserError(
        f"--attn {name} runs on {library.name} here, which needs {library.page_rule()}; "
        f"got --page-size {page_size}{hint}"
    )


def check_head_dim(
    name: str, library: Library | None, head_dim: int, capability: tuple[int, int] | None
) -> None:
    """The head sizes each library's kernels are built for (from their own checks)."""
    if library is None or capability is None:
        return
    rule = library.head_dims_for(capability[0])
    if rule is not None and not rule.takes(head_dim):
        raise UserError(
            f"--attn {name} on compute capability {_capability_text(capability)}: {library.name}, "
            f"head sizes {rule.words} only; this model's is {head_dim}"
        )


def check_kv_dtype(
    spec: BackendSpec, phase: str, kv_dtype: torch.dtype | None, dtype: torch.dtype | None
) -> None:
    """A UserError unless `spec`'s `phase` kernels read a KV cache of `kv_dtype` while computing in
    `dtype`. None: not known yet (the frontend, before the model is read), not checked; a 16-bit
    cache with the dtype unknown may be the model's own, and is checked once it is known."""
    if kv_dtype is None or kv_dtype == dtype or (dtype is None and kv_dtype.itemsize > 1):
        return
    name = kv_dtype_name(kv_dtype)
    if spec.reads_kv(phase, name):
        return
    raise UserError(
        f"--attn {spec.name} cannot {phase} with --kv-cache-dtype {name}; backends that can: "
        f"{', '.join(kv_readers(name))}"
    )
