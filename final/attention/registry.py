"""The attention backends, one descriptor each (spec.py says what a descriptor holds).

    torch    gathers pages and calls scaled_dot_product_attention; CPU and GPU; the reference
    fi       FlashInfer's paged prefill and decode wrappers (flashinfer-python; CUDA)
    fa       FlashAttention: 4 (flash-attn-4) on Hopper and Blackwell, else 3 or 2 (fa_backend.py)
    trtllm   FlashInfer's TensorRT-LLM kernels: decode on Hopper and Blackwell, prefill on
             Blackwell (10.x) only; pages of 16, 32 or 64 tokens (trtllm_backend.py)

A new backend is its own file (a subclass of base.AttentionBackend) and its descriptor in
BACKENDS below: `--attn NAME`, `--help`, `auto` and every check then know it.

`auto` ranks the descriptors' `Auto` entries, chosen by number from the attention benchmarks
(`bash scripts/gpu_run.sh bench-attn`: every pair at page size 16; `python
scripts/results_attention.py benchmarks/results/<gpu>` prints each phase's winner and the order
they give; the "Attention backends" page of the docs shows them). Ranks are per compute capability;
where two GPUs of one were measured, they follow the one measured last (it ran the newer engine):
  Hopper (9.x): benchmarks/results/h200/attn_{offline,latency,prefill}_<pair>_h200.json (fi, fa,
  fi,fa and fa,fi in one call, 2026-11-28, with FlashAttention 4's call replayed and the fused
  q/k-norm + RoPE + K/V kernel under programmatic dependent launch). Prefill: FlashAttention 4
  (prompt tokens/s ahead of FlashInfer's at 512, 2,048 and 8,192 tokens, issue 26's goal). Decode:
  FlashInfer, then FlashAttention 4 (the batch-1 step and the offline throughput within 1% of each
  other; results_attention's decode score, which weighs the two, puts FlashInfer first, and `fa,fi`
  is the best offline pair). The H100's table (benchmarks/results/h100/attn_*_h100.json, all six
  pairs, before the replay and PDL) ordered both phases the other way; it is to be measured again.
  Blackwell (10.x): not measured (no such GPU lent): the design's intent, TRT-LLM for both
  phases as Mini-SGLang picks there, ranked after FlashInfer until measured.
"""

from __future__ import annotations

from .libraries import FLASH_ATTENTION_2, FLASH_ATTENTION_3, FLASH_ATTENTION_4, FLASHINFER, TRTLLM
from .spec import Auto, BackendSpec

HALF = ("bfloat16", "float16")  # no fast backend has float32 kernels
FP8 = "fp8_e4m3"  # the --kv-cache-dtype of an FP8 pool
GPU_NAMES = {8: "Ampere/Ada", 9: "Hopper", 10: "Blackwell 10.x", 12: "Blackwell 12.x"}

# --8<-- [start:backends]
BACKENDS: dict[str, BackendSpec] = {
    spec.name: spec
    for spec in (
        BackendSpec(
            "torch",
            "reference, any device",
            "final.attention.torch_backend:TorchBackend",
            reference=True,
            kv_dtypes=None,  # any cache: it converts what it gathers to the model's dtype
        ),
        BackendSpec(
            "fi",
            "FlashInfer",
            "final.attention.flashinfer_backend:FlashInferBackend",
            (FLASHINFER,),
            HALF,
            auto=Auto(rank=1, decode_rank=0),
            kv_dtypes=(FP8,),  # plan(kv_data_type=float8_e4m3fn), run(k_scale=, v_scale=)
        ),
        BackendSpec(
            "fa",
            "FlashAttention",
            "final.attention.fa_backend:FlashAttentionBackend",
            (FLASH_ATTENTION_4, FLASH_ATTENTION_3, FLASH_ATTENTION_2),
            HALF,
            alternative="fi",
            # The prefill first on Hopper only: on Blackwell, after FlashInfer's and TRT-LLM's until
            # measured there.
            auto=Auto(rank=3, prefill=(9, 10), decode=(9,), decode_rank=1, prefill_rank_on=((9, 0),)),
            # No narrower cache: FlashAttention 4 asserts that q, k and v share bf16 or fp16
            # (flash_attn/cute/interface.py); FlashAttention 3 reads fp8 only beside an fp8 query
            # (q/k/v_descale), FlashAttention 2 not at all.
            kv_dtypes=(),
        ),
        BackendSpec(
            "trtllm",
            "FlashInfer's TensorRT-LLM kernels; prefill on compute capability 10.x only",
            "final.attention.trtllm_backend:TrtllmBackend",
            (TRTLLM,),
            HALF,
            alternative="fi",
            auto=Auto(rank=2, prefill=(10,), decode=(9, 10), decode_rank=2),
            # Decode: XQA on Hopper reads an fp8 cache beside a bf16 query (scales through bmm1_scale
            # and bmm2_scale). FlashInfer 0.7.2's trtllm-gen prefill has no bf16-query, fp8-KV form.
            kv_dtypes=(FP8,),
            prefill_kv_dtypes=(),
        ),
    )
}
# --8<-- [end:backends]


def backend_names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def reference_backend() -> BackendSpec:
    return next(spec for spec in BACKENDS.values() if spec.reference)


def auto_candidates(phase: str, major: int | None) -> list[BackendSpec]:
    """What `auto` tries for `phase` on a GPU of this compute-capability major, best first (the
    reference backend, its last resort, not included). `major` None: a GPU not known."""
    ranked = [s for s in BACKENDS.values() if s.auto is not None and s.auto.considers(phase, major)]
    return sorted(ranked, key=lambda s: s.auto.rank_for(phase, major))  # type: ignore[union-attr]


def named_gpus() -> list[int]:
    """The majors some backend's `auto` entry names: those --help describes one by one."""
    majors = set()
    for spec in BACKENDS.values():
        if spec.auto is not None:
            majors.update(spec.auto.prefill or ())
            majors.update(spec.auto.decode or ())
    return sorted(majors)


def describe_auto() -> str:
    """What `auto` picks, in words (for --help), if the first candidates are installed."""
    reference = reference_backend().name
    parts = []
    for major in [*named_gpus(), None]:
        prefill = (auto_candidates("prefill", major) or [reference_backend()])[0].name
        decode = (auto_candidates("decode", major) or [reference_backend()])[0].name
        gpu = "other GPUs" if major is None else GPU_NAMES.get(major, f"{major}.x")
        parts.append(f"{gpu}: {prefill if prefill == decode else f'{prefill},{decode}'}")
    return (
        "; ".join(parts) + f"; the CPU or float32: {reference}. A backend not installed, or without "
        "kernels for the model's head size or the --page-size set, is skipped for the next "
        f"(and at last {reference})"
    )


def describe_page_sizes() -> str:
    """The page sizes the backends' libraries choose when none is set, for --help."""
    parts = []
    for spec in BACKENDS.values():
        for lib in spec.libraries:
            if lib.default_page_size != 1:
                takes = (
                    f", which takes {lib.page_rule().removeprefix('--page-size ')}" if lib.page_sizes else ""
                )
                parts.append(f"{lib.default_page_size} when {spec.name} runs on {lib.name}{takes}")
    return "; ".join(parts)


def describe_backends() -> str:
    """Every backend in a line, for --help."""
    return ", ".join(f"{spec.name} ({spec.summary})" for spec in BACKENDS.values())


def kv_readers(kv_dtype: str) -> list[str]:
    """The backends (per phase where it differs) that read a `kv_dtype` cache, for messages."""
    names = []
    for spec in BACKENDS.values():
        prefill, decode = spec.reads_kv("prefill", kv_dtype), spec.reads_kv("decode", kv_dtype)
        if prefill or decode:
            names.append(
                spec.name if prefill == decode else f"{spec.name} ({'prefill' if prefill else 'decode'})"
            )
    return names
