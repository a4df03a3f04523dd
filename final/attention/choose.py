"""Which backends serve a run: `--attn auto` resolved for this GPU, every name checked against
what the machine has (support.py), and the page size that suits both phases' kernels.

`AUTO` (core/attention_auto.py, which imports no torch so that `--help` stays fast) is the one
table to change when the attention benchmarks (`bash scripts/gpu_run.sh
bench-attn`, rendered on the "Attention backends" page of the docs) show a faster choice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..core.attention_auto import AUTO, AUTO_OTHER_GPUS, NAMES
from ..core.errors import UserError
from . import support
from .support import HALF_DTYPES, PHASES, Library

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttentionChoice:
    prefill: str
    decode: str
    page_size: int
    prefill_library: Library | None = None  # None: the torch backend, which needs none
    decode_library: Library | None = None

    @property
    def names(self) -> tuple[str, str]:
        return self.prefill, self.decode


def parse_spec(spec: str) -> tuple[str, str]:
    """'fi' -> ('fi', 'fi'); 'fa,trtllm' -> ('fa', 'trtllm'); unknown names are UserErrors."""
    names = [n.strip() for n in spec.split(",")]
    if len(names) not in (1, 2) or not all(names):
        raise UserError(f"--attn takes NAME, PREFILL,DECODE or auto, got {spec!r}")
    for name in names:
        if name not in NAMES:
            raise UserError(f"unknown attention backend {name!r}; choose from {', '.join(NAMES)} or auto")
    return names[0], names[-1]


def resolve_attention(
    spec: str,
    device: torch.device | str,
    dtype: torch.dtype | None = None,
    page_size: int | None = None,
    probe_gpu: bool = True,
    head_dim: int | None = None,
) -> AttentionChoice:
    """The backends and page size for `--attn spec`; `dtype` None: not known yet (not checked);
    `page_size` None: not set by the user (the kernels' preferred size is taken); `head_dim`
    None: not known (not checked). With `probe_gpu` False (the frontend, which must not touch
    the GPU) the compute capability is not checked, and `auto` is resolved as for an unknown GPU."""
    device = torch.device(device)
    capability = support.device_capability(device) if probe_gpu else None
    setup = _Setup(device.type, capability, dtype, page_size, head_dim)
    names = _auto(setup) if spec == "auto" else parse_spec(spec)
    libraries = [setup.library(name, phase) for name, phase in zip(names, PHASES, strict=True)]
    chosen = _page_size(names, libraries, page_size)
    if page_size is None and chosen != 1 and probe_gpu:
        takes = next(lib for lib in libraries if lib is not None and not lib.takes_page_size(1))
        log.info(
            "page size %d: %s takes %s (set --page-size to choose)", chosen, takes.name, takes.page_rule()
        )
    return AttentionChoice(names[0], names[1], chosen, libraries[0], libraries[1])


def resolve_names(
    spec: str, device: torch.device | str, dtype: torch.dtype | None = None, page_size: int | None = None
) -> tuple[str, str]:
    return resolve_attention(spec, device, dtype, page_size).names


@dataclass(frozen=True)
class _Setup:
    """What the machine and the model offer a backend."""

    device_type: str
    capability: tuple[int, int] | None
    dtype: torch.dtype | None
    page_size: int | None
    head_dim: int | None

    def library(self, name: str, phase: str) -> Library | None:
        """The library `name` runs `phase` on here, or a UserError saying why it cannot."""
        library = support.pick_library(name, phase, self.device_type, self.capability, self.dtype)
        if self.head_dim is not None:
            support.check_head_dim(name, library, self.head_dim, self.capability)
        return library


def _auto(setup: _Setup) -> tuple[str, str]:
    if not support.is_cuda(setup.device_type) or (setup.dtype is not None and setup.dtype not in HALF_DTYPES):
        return "torch", "torch"
    capability = setup.capability
    prefill_options, decode_options = (
        AUTO.get(capability[0], AUTO_OTHER_GPUS) if capability else AUTO_OTHER_GPUS
    )
    prefill = _first(setup, prefill_options, "prefill", None)
    decode = _first(setup, decode_options, "decode", prefill[1])
    return prefill[0], decode[0]


def _first(
    setup: _Setup, options: tuple[str, ...], phase: str, prefill: Library | None
) -> tuple[str, Library | None]:
    """The first option that runs here, takes the page size, and shares one with the prefill's."""
    for name in options:
        try:
            library = setup.library(name, phase)
        except UserError:
            continue
        if (
            library is not None
            and setup.page_size is not None
            and not library.takes_page_size(setup.page_size)
        ):
            continue
        if setup.page_size is None and _common_page_size([library, prefill]) is None:
            continue
        return name, library
    return "torch", None


def _common_page_size(libraries: list[Library | None]) -> int | None:
    """The smallest of the libraries' preferred page sizes (and 1) that all of them take."""
    present = [lib for lib in libraries if lib is not None]
    for size in sorted({1, *(lib.default_page_size for lib in present)}):
        if all(lib.takes_page_size(size) for lib in present):
            return size
    return None


def _page_size(names: tuple[str, str], libraries: list[Library | None], page_size: int | None) -> int:
    if page_size is not None:
        for name, library in zip(names, libraries, strict=True):
            support.check_page_size(name, library, page_size)
        return page_size
    size = _common_page_size(libraries)
    if size is None:
        rules = " and ".join(f"{lib.name} ({lib.page_rule()})" for lib in libraries if lib is not None)
        raise UserError(f"--attn {','.join(names)}: no page size suits both {rules}")
    return size
