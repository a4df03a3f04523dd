"""Where the GPU time of a decode step goes: the GPU's kernels and copies of a profiled window,
grouped by a readable short name and sorted into categories (gemm, attention, norm, ...).

A CUDA kernel's name in a torch profiler trace is its demangled C++ signature, e.g.

    void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>,
        at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)

`short_name` keeps the function's own name (`vectorized_elementwise_kernel`) and, for the generic
kernels that torch, CUTLASS and FlashInfer instantiate for many operations, the operation they
were instantiated with (`FillFunctor`): without it every elementwise op of a step would read as
one kernel. `category` then reads the short name (namespace included) against ordered rules.

Everything here is a pure function of (name, microseconds) pairs, so it is tested on the CPU with
made-up names; the rules were written from the kernel names of torch (ATen), cuBLAS, CUTLASS,
FlashInfer and NCCL. A kernel no rule knows is "other": the table still shows its name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# Ordered: the first rule whose pattern is found in the short name (lower-cased, namespaces kept)
# wins. Specific kinds come before the broad ones: FlashInfer's CuTe-DSL norm kernels are named
# `kernel_cutlass_...RMSNorm...`, so norm must win over gemm's `cutlass`; a fused
# `RopeQuantizeAppendPagedKVCacheKernel` stores the cache; a `FillFunctor` is a fill (copy/index)
# before it is a functor (elementwise). kv-store's `index_put` is torch's `cache[slots] = k`, how
# the stages' and final/'s KV pools store K and V, two a layer; the one other in a decode step,
# final/'s runner writing the sampled tokens into its token table, is counted with them.
# `pick_kernel` is the second pass of final/'s Gumbel-max sampler (final/kernels/sampling.py).
CATEGORY_RULES: tuple[tuple[str, str], ...] = (
    ("nccl", r"nccl|all_?reduce|all_?gather|reduce_?scatter|cross_device_reduce"),
    (
        "attention",
        r"attention|attn|fmha|\bmha|_mha|batchdecode|batchprefill|singledecode|singleprefill"
        r"|decodewithkvcache|prefillwithkvcache|flash_fwd|mergestate|xqa",
    ),
    ("kv-store", r"appendpagedkv|append_paged|store_?kv|store_cache|reshape_and_cache|set_kv|index_put"),
    ("norm", r"rms_?norm|layer_?norm|group_?norm|batch_?norm|norm::"),
    ("rope", r"(?<![a-z])rope|rotary|pos_?enc"),
    ("activation", r"silu|gelu|swiglu|act_and_mul|relu|sigmoid|tanh"),
    (
        "sampling",
        r"sampling|gumbel|pick_kernel|argmax|argmin|topk|top_k|sort|softmax|multinomial|exponential"
        r"|distribution|philox",
    ),
    ("gemm", r"gemm|gemv|nvjet|cublas|cutlass|xmma|matmul|splitk"),
    (
        "copy/index",
        r"memcpy|memset|copy|fill|index|indices|gather|scatter|catarray|embedding|arange|decode_inputs",
    ),
    ("elementwise", r"elementwise|reduce_kernel|functor|scan|triton_poi|triton_red|triton_per|_kernel_cuda"),
)
CATEGORIES = (*(name for name, _ in CATEGORY_RULES), "other")
_COMPILED = tuple((name, re.compile(pattern)) for name, pattern in CATEGORY_RULES)

# Generic kernels: their own name says little, the operation in their template says what they do.
_GENERIC = re.compile(
    r"(elementwise_kernel\w*|reduce_kernel|^Kernel2?|^device_kernel|^PersistentKernel|^kernel)$"
)
# In a generic kernel's template: a name that says what it computes (a functor, a reduction's
# ops, the function a lambda was defined in, a CUTLASS GEMM's procedural name) ...
_HINT = re.compile(r"functor|gemm|attention|(ops|_impl|_cuda|kernel|norm)$", re.IGNORECASE)
# ... but not the wrappers that hold it.
_WRAPPERS = {
    "AUnaryFunctor",
    "BUnaryFunctor",
    "BinaryFunctor",
    "gpu_kernel_impl",
    "gpu_kernel_impl_nocast",
    "gpu_index_kernel",
    "launch_kernel",
}
_IDENT = re.compile(r"[A-Za-z_]\w*")


def _base(name: str) -> tuple[str, int]:
    """The kernel's qualified function name (templates and arguments cut off) and where it starts
    in `name`: the last word before the argument list at the outermost level (the words before it
    are the return type, `void` or `std::enable_if<...>::type`)."""
    depth, word_start, chars = 0, 0, []
    for i, c in enumerate(name):
        if c in "<(":
            if depth == 0 and c == "(":  # the argument list: the name is the last word before it
                break
            depth += 1
        elif c in ">)":
            depth = max(depth - 1, 0)
        elif depth == 0:
            if c == " ":
                word_start, chars = i + 1, []
            else:
                chars.append(c)
    return "".join(chars).strip(":"), word_start


def short_name(name: str) -> tuple[str, str]:
    """(display name, qualified name to categorise): the function's own name without namespaces,
    templates and arguments, with the operation a generic kernel was instantiated for."""
    if name.startswith(("Memcpy", "Memset")):  # the profiler's copies: "Memcpy HtoD (Pinned -> Device)"
        return name, name
    name = name.replace("(anonymous namespace)", "anonymous")
    qualified, rest = _base(name)
    if not qualified:  # nothing readable: keep the name as it is
        return name, name
    own = qualified.rsplit("::", 1)[-1]
    if _GENERIC.search(own):
        hint = next(
            (
                tok
                for tok in _last_components(name[rest:])
                if tok != own and tok not in _WRAPPERS and _HINT.search(tok)
            ),
            None,
        )
        if hint:
            return f"{own} ({hint})", f"{qualified} ({hint})"
        if own.lower() in ("kernel", "kernel2", "device_kernel"):  # alone it says nothing
            return qualified, qualified
    return own, qualified


def _last_components(text: str) -> Iterable[str]:
    """The identifiers of `text` that end a qualified name (`MulFunctor` of `at::native::MulFunctor`)."""
    for match in _IDENT.finditer(text):
        if not text.startswith("::", match.end()):
            yield match.group()


def category(qualified: str) -> str:
    lowered = qualified.lower()
    return next((name for name, rule in _COMPILED if rule.search(lowered)), "other")


def breakdown(work: Iterable[tuple[str, float]], steps: int, busy_us: float, top: int = 25) -> dict[str, Any]:
    """Group the GPU's work of a window of `steps` steps, given as (kernel name, microseconds)
    pairs, by short name. Per step: how often each ran, its microseconds, and its share of the
    window's busy time (`busy_us`, overlaps counted once, so shares of kernels that ran at the same
    time may add up past 1). The `top` names by time, every category, and the rest as one row."""
    groups: dict[tuple[str, str], list[float]] = {}
    for name, us in work:
        shown, qualified = short_name(name)
        group = groups.setdefault((shown, category(qualified)), [0, 0.0])
        group[0] += 1
        group[1] += us

    def row(count: float, us: float) -> dict[str, float]:
        return {
            "count": round(count / steps, 2),
            "us": round(us / steps, 1),
            "share": round(us / busy_us, 4) if busy_us else 0.0,
        }

    ranked = sorted(groups.items(), key=lambda item: (-item[1][1], item[0]))
    per_category: dict[str, list[float]] = {}
    for (_, cat), (count, us) in ranked:
        totals = per_category.setdefault(cat, [0, 0.0])
        totals[0] += count
        totals[1] += us
    rest = ranked[top:]
    return {
        "busy_us": round(busy_us / steps, 1),
        "categories": [
            {"category": cat, **row(count, us)}
            for cat, (count, us) in sorted(per_category.items(), key=lambda item: (-item[1][1], item[0]))
        ],
        "top": [
            {"name": shown, "category": cat, **row(count, us)} for (shown, cat), (count, us) in ranked[:top]
        ],
        "rest": {
            "names": len(rest),
            **row(sum(c for _, (c, _) in rest), sum(us for _, (_, us) in rest)),
        },
    }
