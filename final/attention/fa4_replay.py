"""FlashAttention 4's compiled kernel called directly, once one official call has shown how.

Why: `flash_attn.cute.flash_attn_varlen_func` runs an autograd Function around
`interface._flash_attn_fwd`, hundreds of lines of argument checks, tile heuristics and compile-key
building, before the one call that matters: `_flash_attn_fwd.compile_cache[key](*args)`, a kernel
compiled with TVM FFI that takes torch tensors as they are. That Python runs on the host for every
layer of every step, and a prefill runs eagerly, so for a short prompt it is most of the first
token's time (issue 26: several times FlashInfer's `run` per layer).

How: the first call of each kind (prefill or decode, and everything of ours that the compile key or
the interface's per-call choices could see) goes through the official function while `Spy` stands
in for the compile cache and records the kernel it hands out and the arguments it is called with.
If every argument is one of our tensors, the output the interface allocated, our softmax scale,
None, or a tuple of Nones (`AuxData(None, None)`), later calls of that kind allocate the output
and call the kernel themselves with that call's tensors in those places. Anything else (a tensor
the interface computed: scheduler metadata, split-KV partials, an aligned copy of q; another
number; two kernels) is work the interface does per call that a replay would skip, so that kind
keeps the official path for good.

What it relies on: that the interface picks the same kernel and the same constants for every call
of a kind, whatever the lengths. In flash-attn-4 4.0.0b36 that holds on Hopper (see
`FlashAttention4` in fa_backend.py), except that above `BIN_BATCH_SEARCH_THRESH` requests it adds
a batch-lookup aid (tensors it computes), so the batch size's side of that line is part of our
kind. On Blackwell the kernel and a `max_seqlen_q` argument follow the row counts: no replay there.
A flash-attn-4 whose key or arguments follow the shapes on Hopper would break it, silently;
tests/final/attention/test_final_gpu_attention.py compares replayed and official outputs bit for
bit over many lengths and batch sizes. `FINAL_FA4_REPLAY=0` turns it off, to measure what it buys.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import support

log = logging.getLogger(__name__)

ENV = "FINAL_FA4_REPLAY"  # "0": every call through FlashAttention 4's interface


def replay_wanted() -> bool:
    return os.environ.get(ENV, "1") != "0"


class Spy:
    """Stands in for `_flash_attn_fwd.compile_cache` during one official call: each kernel it hands
    out records its calls; lookups, inserts (a first compile) and attributes are the real cache's."""

    def __init__(self, real):
        self.real = real
        self.calls: list[tuple[Callable[..., Any], tuple, dict]] = []

    def __getitem__(self, key):
        kernel = self.real[key]

        def recorded(*args, **kwargs):
            self.calls.append((kernel, args, kwargs))
            return kernel(*args, **kwargs)

        return recorded

    def __contains__(self, key) -> bool:
        return key in self.real

    def __setitem__(self, key, kernel) -> None:
        self.real[key] = kernel

    def __getattr__(self, name):  # only for names not set above, e.g. JITCache's `cache`
        return getattr(self.real, name)


@dataclass(frozen=True)
class Replay:
    """One recorded kernel call: `args` as recorded, tensors blanked (we hold none of that call's);
    at each position in `ours` goes that call's tensor of ours, at `out_at` a fresh output."""

    kernel: Callable[..., Any]
    args: tuple
    ours: tuple[tuple[int, int], ...]  # (argument position, index in our tensors)
    out_at: int

    def __call__(self, tensors: Sequence[torch.Tensor], out: torch.Tensor) -> None:
        args = list(self.args)
        for at, i in self.ours:
            args[at] = tensors[i]
        args[self.out_at] = out
        self.kernel(*args)


def view(t: torch.Tensor) -> tuple:
    return t.data_ptr(), t.shape, t.stride(), t.dtype, t.device


def same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same memory seen the same way (the interface passes `q.detach()`: a new tensor object)."""
    return view(a) == view(b)


def only_nones(arg) -> bool:
    return isinstance(arg, tuple | list) and all(a is None or only_nones(a) for a in arg)


def learn(spy: Spy, ours: Sequence[torch.Tensor], out_shape: tuple, scale: float, returned) -> Replay | str:
    """The replay of what `spy` saw, or why there is none."""
    if len(spy.calls) != 1:
        return f"{len(spy.calls)} compiled calls in one call"
    kernel, args, kwargs = spy.calls[0]
    if kwargs:
        return f"keyword arguments {sorted(kwargs)}"
    q = ours[0]
    kept: list = []
    mine: list[tuple[int, int]] = []
    outs: list[int] = []
    for at, arg in enumerate(args):
        kept.append(None if isinstance(arg, torch.Tensor) else arg)
        if isinstance(arg, torch.Tensor):
            matches = [i for i, t in enumerate(ours) if same_view(arg, t)]
            if len(matches) == 1:
                mine.append((at, matches[0]))
            elif (
                not matches
                and tuple(arg.shape) == out_shape
                and arg.dtype == q.dtype
                and arg.device == q.device
                and arg.is_contiguous()
            ):
                outs.append(at)
            else:
                return f"argument {at} is a tensor of the interface's own ({tuple(arg.shape)}, {arg.dtype})"
        elif not (arg is None or (isinstance(arg, float) and arg == scale) or only_nones(arg)):
            return f"argument {at} is {arg!r}, not ours"
    if sorted(i for _, i in mine) != list(range(len(ours))):
        return f"our tensors went to {mine}, not each to one place"
    if len(outs) != 1:
        return f"{len(outs)} output tensors"
    if not (isinstance(returned, torch.Tensor) and same_view(returned, args[outs[0]])):
        return "it returned another tensor than the kernel wrote"
    return Replay(kernel, tuple(kept), tuple(mine), outs[0])


def layout(t: torch.Tensor) -> tuple:
    """What the interface looks at to decide, per call, whether to copy a tensor to an aligned,
    contiguous layout (a copy we would miss): in the kind, so each decision is recorded once."""
    return t.stride(), t.is_contiguous(), t.data_ptr() % 16 == 0


class FA4Replay:
    """Routes each call of `FlashAttention4` through the official interface or its replay."""

    def __init__(self, module, enabled: bool | None = None):
        interface = getattr(module, "interface", None)
        self.fwd = getattr(interface, "_flash_attn_fwd", None)
        self.threshold = getattr(interface, "BIN_BATCH_SEARCH_THRESH", None)
        # No compile cache or threshold where we expect them: not the interface this was written for.
        self.enabled = (replay_wanted() if enabled is None else enabled) and (
            hasattr(self.fwd, "compile_cache") and isinstance(self.threshold, int)
        )
        self.hopper: bool | None = None  # known at the first call, from its device
        self.kinds: dict[tuple, Replay | None] = {}  # None: this kind takes the official path

    def __call__(
        self,
        phase: str,
        ours: Sequence[torch.Tensor],
        scale: float,
        official: Callable[[], torch.Tensor],
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`ours`: q, k_cache, v_cache, then the metadata tensors, as the interface is given them;
        `official()` makes the call through the interface and returns its output. A replay writes
        into `out` where given (contiguous, the output's shape); the official call, its own."""
        if not self.enabled or ours[0].shape[0] == 0:  # no queries: the interface launches nothing
            return official()
        q, k, v, page_table = ours[0], ours[1], ours[2], ours[-1]
        # Everything of ours the compile key or the interface's choices could see; not the lengths.
        kind = (phase, q.dtype, k.dtype, v.dtype, q.shape[1:], k.shape[1:], v.shape[-1], scale,
                layout(q), layout(k), layout(v), page_table.shape[0] > self.threshold)  # fmt: skip
        replay = self.kinds.get(kind)
        if replay is not None:
            if out is None or not out.is_contiguous():
                out = q.new_empty((*q.shape[:-1], v.shape[-1]))
            replay(ours, out)
            return out
        if kind in self.kinds or not self.on_hopper(q):
            return official()
        spy = Spy(self.fwd.compile_cache)
        self.fwd.compile_cache = spy
        try:
            out = official()
        finally:
            self.fwd.compile_cache = spy.real
        if spy.calls:  # none: the interface returned without launching; decide at a later call
            learned = learn(spy, ours, (*q.shape[:-1], v.shape[-1]), scale, out)
            if isinstance(learned, str):
                log.info("FlashAttention 4 %s: no replay for this kind of call, %s", phase, learned)
            self.kinds[kind] = None if isinstance(learned, str) else learned
        return out

    def on_hopper(self, q: torch.Tensor) -> bool:
        if self.hopper is None:
            capability = support.device_capability(q.device)
            self.hopper = capability is not None and capability[0] == 9
            if not self.hopper:
                log.debug("FlashAttention 4: no replay on compute capability %s", capability)
        return self.hopper
