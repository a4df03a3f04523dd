"""Which backends serve a run: `--attn auto` resolved for this GPU from the descriptors' `Auto`
entries (registry.py), every name checked against what the machine has (support.py), and the
page size that suits both phases' kernels. The engine resolves once, in engine/resolve.py; the
result (`AttentionChoice`) is what factory.py builds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..core.errors import UserError
from . import support
from .registry import BACKENDS, auto_candidates, backend_names, reference_backend
from .spec import BackendSpec, Library
from .support import PHASES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttentionChoice:
    prefill: str
    decode: str
    page_size: int
    prefill_library: Library | None = None  # None: a backend that needs none (torch)
    decode_library: Library | None = None

    @property
    def names(self) -> tuple[str, str]:
        return self.prefill, self.decode

    @property
    def label(self) -> str:
        """What logs and EngineInfo call it: NAME, or PREFILL,DECODE."""
        return self.prefill if self.prefill == self.decode else f"{self.prefill},{self.decode}"


def parse_spec(spec: str) -> tuple[str, str]:
    """'fi' -> ('fi', 'fi'); 'fa,trtllm' -> ('fa', 'trtllm'); unknown names are UserErrors."""
    names = [n.strip() for n in spec.split(",")]
    if len(names) not in (1, 2) or not all(names):
        raise UserError(f"--attn takes NAME, PREFILL,DECODE or auto, got {spec!r}")
    for name in names:
        if name not in BACKENDS:
            known = ", ".join(backend_names())
            raise UserError(f"unknown attention backend {name!r}; choose from {known} or auto")
    return names[0], names[-1]


def resolve_attention(
    spec: str,
    device: torch.device | str,
    dtype: torch.dtype | None = None,
    page_size: int | None = None,
    probe_gpu: bool = True,
    head_dim: int | None = None,
    kv_dtype: torch.dtype | None = None,
) -> AttentionChoice:
    """The backends and page size for `--attn spec`; `dtype` None: not known yet (not checked);
    `page_size` None: not set by the user (the kernels' preferred size is taken); `head_dim`
    None: not known (not checked); `kv_dtype`: the KV pool's, which `auto` picks backends that
    read (None: not known, not checked). With `probe_gpu` False (the frontend, which must not
    touch the GPU) the compute capability is not checked, and `auto` is resolved as for an
    unknown GPU."""
    device = torch.device(device)
    capability = support.device_capability(device) if probe_gpu else None
    setup = _Setup(device.type, capability, dtype, page_size, head_dim, kv_dtype)
    names = _auto(setup) if spec == "auto" else parse_spec(spec)
    libraries = [setup.library(name, phase) for name, phase in zip(names, PHASES, strict=True)]
    chosen = _page_size(names, libraries, page_size)
    if page_size is None and chosen != 1 and probe_gpu:
        prefers = next(lib for lib in libraries if lib is not None and lib.default_page_size == chosen)
        rule = "" if prefers.takes_page_size(1) else f"; it takes {prefers.page_rule()}"
        log.info("page size %d, %s's choice%s (set --page-size to choose)", chosen, prefers.name, rule)
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
    kv_dtype: torch.dtype | None = None

    def library(self, name: str, phase: str) -> Library | None:
        """The library `name` runs `phase` on here, or a UserError saying why it cannot."""
        # The cache first: a backend that cannot read it is the wrong choice on any machine.
        support.check_kv_dtype(BACKENDS[name], phase, self.kv_dtype, self.dtype)
        library = support.pick_library(BACKENDS[name], phase, self.device_type, self.capability, self.dtype)
        if self.head_dim is not None:
            support.check_head_dim(name, library, self.head_dim, self.capability)
        return library


def _auto(setup: _Setup) -> tuple[str, str]:
    """Per phase the first candidate that runs here; the reference backend when none does (on the
    CPU and in float32 no candidate does: their checks refuse)."""
    major = setup.capability[0] if setup.capability else None
    prefill = _first(setup, auto_candidates("prefill", major), "prefill", None)
    decode = _first(setup, auto_candidates("decode", major), "decode", prefill[1])
    return prefill[0], decode[0]


def _first(
    setup: _Setup, options: list[BackendSpec], phase: str, prefill: Library | None
) -> tuple[str, Library | None]:
    """The first option that runs here, takes the page size, and shares one with the prefill's."""
    for spec in options:
        try:
            library = setup.library(spec.name, phase)
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
        return spec.name, library
    return reference_backend().name, None


def _common_page_size(libraries: list[Library | None]) -> int | None:
    """The largest page size some library prefers (1: no preference) that all of them take, else 1
    if all take it: fi and fa together run fa's 16, fa and trtllm trtllm's 64."""
    present = [lib for lib in libraries if lib is not None]
    preferred = sorted({lib.default_page_size for lib in present} - {1}, reverse=True)
    for size in [*preferred, 1]:
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
