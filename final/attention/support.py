"""What each attention backend needs: a CUDA GPU of some compute capability, bfloat16 or float16,
a kernel library, a page size and a head size. Everything is checked here, before a backend is
built, so a machine that cannot run one gets a single message naming the package or the GPU it
lacks, never an ImportError or an assertion from inside a kernel.

Where the libraries state their limits (each `Library` below cites it):
- FlashAttention 4 (`flash-attn-4`, `flash_attn.cute`): paged KV on compute capability 9.x and
  10.x/11.x (its interface asserts "paged KV not supported" on 8.x and 12.x); any page size, pages
  of exactly one KV tile (128 tokens for head sizes up to 128) load by TMA, others by cp.async.
- FlashAttention 3 (`flash_attn_interface`, built from hopper/ of the repository): Hopper only;
  "page_block_size can be arbitrary".
- FlashAttention 2 (`flash-attn`): Ampere, Ada and Hopper; "page_block_size must be a multiple
  of 256".
- TRT-LLM kernels in FlashInfer: decode through XQA on 9.x and 12.x and trtllm-gen on 10.x,
  prefill (trtllm-gen only) on 10.x; XQA compiles for 16, 32, 64 or 128 tokens per page, and we
  take the sizes both kernel families serve, 16, 32 and 64.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from ..core.errors import UserError

HALF_DTYPES = (torch.float16, torch.bfloat16)  # no fast backend has float32 kernels
PHASES = ("prefill", "decode")

HOPPER_AND_BLACKWELL = "a Hopper or Blackwell datacenter GPU (compute capability 9.x, 10.x or 11.x)"


@dataclass(frozen=True)
class Library:
    """One kernel library a backend can run on, and what it needs."""

    name: str  # what messages call it
    install: str  # how to install it
    modules: tuple[str, ...]  # what must be importable: the library, then what it imports
    prefill_majors: tuple[int, ...] | None  # compute capability majors it prefills on (None: any)
    decode_majors: tuple[int, ...] | None
    gpus: str  # those GPUs, in words
    page_sizes: tuple[int, ...] = ()  # the page sizes it takes (empty: any)
    page_multiple: int = 1  # ... or: page sizes must be multiples of this
    default_page_size: int = 1  # its page size when the user sets none

    def runs(self, phase: str, major: int) -> bool:
        majors = self.prefill_majors if phase == "prefill" else self.decode_majors
        return majors is None or major in majors

    def takes_page_size(self, page_size: int) -> bool:
        if self.page_sizes:
            return page_size in self.page_sizes
        return page_size % self.page_multiple == 0

    def page_rule(self) -> str:
        if self.page_sizes:
            *head, last = [str(s) for s in self.page_sizes]
            return f"--page-size {', '.join(head)} or {last}"
        return f"a --page-size that is a multiple of {self.page_multiple}"


FLASHINFER = Library(
    "FlashInfer",
    "pip install flashinfer-python",
    ("flashinfer",),
    None,
    None,
    "an NVIDIA GPU (compute capability 7.5+)",
)
# https://github.com/Dao-AILab/flash-attention/blob/main/flash_attn/cute/interface.py
FLASH_ATTENTION_4 = Library(
    "FlashAttention 4",
    "pip install flash-attn-4 nvidia-cutlass-dsl quack-kernels",
    ("flash_attn.cute", "cutlass", "quack"),  # cutlass: the CuTe DSL (nvidia-cutlass-dsl)
    (9, 10, 11),
    (9, 10, 11),
    HOPPER_AND_BLACKWELL,
)
# https://github.com/Dao-AILab/flash-attention/blob/main/hopper/flash_attn_interface.py
FLASH_ATTENTION_3 = Library(
    "FlashAttention 3",
    "build flash_attn_3 from hopper/ of Dao-AILab/flash-attention",
    ("flash_attn_interface",),
    (9,),
    (9,),
    "a Hopper GPU (compute capability 9.x)",
)
# https://github.com/Dao-AILab/flash-attention/blob/main/flash_attn/flash_attn_interface.py
FLASH_ATTENTION_2 = Library(
    "FlashAttention 2",
    "pip install flash-attn",
    ("flash_attn.flash_attn_interface",),
    (8, 9),
    (8, 9),
    "an Ampere, Ada or Hopper GPU (compute capability 8.x or 9.x)",
    page_multiple=256,
    default_page_size=256,
)
# https://github.com/flashinfer-ai/flashinfer/blob/main/flashinfer/decode.py (backend="auto")
TRTLLM = Library(
    "FlashInfer's TensorRT-LLM kernels",
    "pip install flashinfer-python",
    ("flashinfer",),
    (10,),
    (9, 10, 12),
    "a Hopper or Blackwell GPU (compute capability 9.x, 10.x or 12.x)",
    page_sizes=(16, 32, 64),
    default_page_size=64,  # Mini-SGLang's choice for these kernels; fewer, larger pages
)

# Each backend's libraries, most preferred first: a backend runs on the first one that is
# installed and supports the GPU.
LIBRARIES: dict[str, tuple[Library, ...]] = {
    "torch": (),
    "fi": (FLASHINFER,),
    "fa": (FLASH_ATTENTION_4, FLASH_ATTENTION_3, FLASH_ATTENTION_2),
    "trtllm": (TRTLLM,),
}
DTYPES: dict[str, tuple[torch.dtype, ...] | None] = {
    "torch": None,  # any
    "fi": HALF_DTYPES,
    "fa": HALF_DTYPES,
    "trtllm": HALF_DTYPES,
}


def is_cuda(device_type: str) -> bool:
    """Whether the fast backends can run on this device type (tests stand them in on the CPU)."""
    return device_type == "cuda"


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
    name: str, phase: str, device_type: str, capability: tuple[int, int] | None, dtype: torch.dtype | None
) -> Library | None:
    """The library `--attn name` runs `phase` on, or a UserError that says what is missing.
    `capability` None on CUDA: not known here (the frontend does not touch the GPU), not checked;
    `dtype` None: not known yet, not checked. None for the torch backend, which needs nothing."""
    libraries = LIBRARIES[name]
    if not libraries:
        return None
    if not is_cuda(device_type):
        raise UserError(f"--attn {name} runs on CUDA GPUs only; use --attn torch on the CPU")
    dtypes = DTYPES[name]
    if dtype is not None and dtypes is not None and dtype not in dtypes:
        raise UserError(
            f"--attn {name} needs --dtype bfloat16 or float16 ({libraries[0].name} has no {dtype} "
            "kernels); use --attn torch for float32"
        )
    present = [lib for lib in libraries if not missing_modules(lib)]
    if not present:
        wanted, alternative = libraries[0], {"fa": "fi", "fi": "torch", "trtllm": "fi"}[name]
        missing = missing_modules(wanted)
        found = "" if missing[0] == wanted.modules[0] else f" (module {missing[0]} not found)"
        raise UserError(
            f"--attn {name} needs {wanted.name}{found}: {wanted.install}; or use --attn {alternative}"
        )
    if capability is None:
        return present[0]
    fits = [lib for lib in present if lib.runs(phase, capability[0])]
    if fits:
        return fits[0]
    gpu = f"compute capability {_capability_text(capability)}"
    if name == "trtllm" and phase == "prefill" and TRTLLM.runs("decode", capability[0]):
        raise UserError(
            f"--attn trtllm cannot prefill on this GPU ({gpu}): FlashInfer's TensorRT-LLM prefill "
            "kernels (trtllm_batch_context_with_kv_cache) exist for compute capability 10.x "
            "(B200, GB200) only. Use it for decode: --attn fa,trtllm or --attn fi,trtllm"
        )
    options = "; ".join(f"{lib.name} needs {lib.gpus}: {lib.install}" for lib in libraries)
    have = ", ".join(lib.name for lib in present)
    raise UserError(f"--attn {name} cannot {phase} on this GPU ({gpu}) with {have}: {options}")


def check_page_size(name: str, library: Library | None, page_size: int) -> None:
    if library is None or library.takes_page_size(page_size):
        return
    hint = ""
    if library is FLASH_ATTENTION_2:
        hint = "; or install flash-attn-4 (Hopper, Blackwell), which takes any page size"
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
    major = capability[0]
    if library in (FLASH_ATTENTION_4, FLASH_ATTENTION_3, FLASH_ATTENTION_2):
        if library is FLASH_ATTENTION_4 and major in (10, 11):
            ok, sizes = (
                (8 <= head_dim <= 128 and head_dim % 8 == 0) or head_dim == 256,
                "8-128 (multiples of 8) or 256",
            )
        else:
            ok, sizes = 8 <= head_dim <= 256 and head_dim % 8 == 0, "8-256 (multiples of 8)"
    elif library is TRTLLM:
        ok, sizes = head_dim in (64, 128, 256), "64, 128 or 256"
    else:
        return
    if not ok:
        raise UserError(
            f"--attn {name} on compute capability {_capability_text(capability)}: {library.name}, "
            f"head sizes {sizes} only; this model's is {head_dim}"
        )
