"""What an attention backend is, as data: the descriptor every part of final/ reads.

A `BackendSpec` says everything about a backend that is known before it is built: its name, the
kernel libraries it can run on (each a `Library`: the package, the GPUs per phase, the page sizes
and head sizes its kernels take), the dtypes it computes in, the KV-cache dtypes it reads, where
`--attn auto` may pick it, and where its class lives. `--help` prints from it, `auto` ranks by it,
support.py checks the machine against it and factory.py builds the class it names. Nothing here
imports torch, so `python -m final --help` reads it at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ANY_GPU = None  # in a majors field: no limit on the compute capability


@dataclass(frozen=True)
class HeadDims:
    """The head sizes a library's kernels are built for: `sizes`, or the multiples of `multiple`
    in [low, high]."""

    words: str  # for messages: "64, 128 or 256"
    sizes: tuple[int, ...] = ()
    low: int = 1
    high: int = 0  # below low: no range
    multiple: int = 1

    def takes(self, head_dim: int) -> bool:
        return head_dim in self.sizes or (self.low <= head_dim <= self.high and head_dim % self.multiple == 0)


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
    head_dims: HeadDims | None = None  # None: any head size
    head_dims_on: tuple[tuple[int, HeadDims], ...] = ()  # (major, rule) pairs, over head_dims
    page_hint: str = ""  # appended to a refused page size: what else would take it
    prefill_note: str = ""  # why it cannot prefill where it decodes (said when asked to)

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

    def head_dims_for(self, major: int) -> HeadDims | None:
        return dict(self.head_dims_on).get(major, self.head_dims)


@dataclass(frozen=True)
class Auto:
    """Where `--attn auto` may pick a backend: per phase the compute-capability majors (ANY_GPU:
    wherever its library runs), and its rank among the candidates there (lower first): `rank` for
    both phases, or `decode_rank` for decode where the benchmarks order that phase differently, and
    `prefill_rank_on` for the prefill on the majors where a GPU of theirs measured it differently
    (FlashAttention 4's prefill leads on Hopper, where it was measured, not on Blackwell, where it
    was not)."""

    rank: int
    prefill: tuple[int, ...] | None = ANY_GPU
    decode: tuple[int, ...] | None = ANY_GPU
    decode_rank: int | None = None
    prefill_rank_on: tuple[tuple[int, int], ...] = ()  # (major, rank) pairs for the prefill

    def rank_for(self, phase: str, major: int | None = None) -> int:
        if phase == "decode":
            return self.rank if self.decode_rank is None else self.decode_rank
        return next((rank for on, rank in self.prefill_rank_on if on == major), self.rank)

    def considers(self, phase: str, major: int | None) -> bool:
        """`major` None: a GPU not known (the frontend) or not named by any backend."""
        majors = self.prefill if phase == "prefill" else self.decode
        return majors is ANY_GPU or (major is not None and major in majors)


# The class a spec builds: (model config, pool, page table, query heads on this rank, library).
Factory = Callable[..., Any]


@dataclass(frozen=True)
class BackendSpec:
    name: str  # what --attn calls it
    summary: str  # what --help says it is
    factory: str | Factory  # "module:Class" (imported when built) or the class itself
    libraries: tuple[Library, ...] = ()  # most preferred first; none: runs anywhere, needs nothing
    dtypes: tuple[str, ...] | None = None  # the dtypes its kernels compute in (None: any)
    alternative: str = "torch"  # what a message suggests when its library is missing
    auto: Auto | None = None  # None: `auto` never picks it
    reference: bool = False  # auto's last resort, and its only choice on the CPU or in float32
    # The KV-cache dtypes (--kv-cache-dtype names) its kernels read besides the one they compute in;
    # None: any (it converts what it gathers). `auto` skips a backend that cannot read the cache.
    kv_dtypes: tuple[str, ...] | None = ()
    prefill_kv_dtypes: tuple[str, ...] | None = None  # where prefill reads fewer (None: kv_dtypes)

    def reads_kv(self, phase: str, kv_dtype: str) -> bool:
        """Whether its `phase` kernels read a cache of `kv_dtype` (one narrower than they compute in)."""
        known = (
            self.prefill_kv_dtypes
            if phase == "prefill" and self.prefill_kv_dtypes is not None
            else self.kv_dtypes
        )
        return known is None or kv_dtype in known
