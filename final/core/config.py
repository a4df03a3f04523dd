"""EngineConfig: every knob of the engine, with its default and its command-line flag, in one
typed place.

The CLI (final/args.py, which builds its flags from these fields: core/flags.py), the offline
`LLM(**engine_kwargs)` and the engine process all build the same object, so a flag means the same
thing everywhere. The project's own names are Mini-SGLang's; each field also answers to vLLM's and
SGLang's names for the same knob (aliases, shown in --help, and keywords of `LLM(...)`), so a
command line or a script written for one of them runs here. It is what the user asked for: build_engine resolves it once (the attention
backends, the page size, overlap, graphs, the devices) into a frozen ResolvedConfig
(engine/resolve.py), and never writes back into it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from .errors import UserError
from .flags import Preset, from_keywords, option
from .parallel_config import ParallelOptions

# vLLM's and SGLang's other names for a dtype (`--dtype half`): the name each stands for.
DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16"}
DTYPES = ("auto", "float32", "bfloat16", "float16")


def dtype_name(text: str) -> str:
    return DTYPE_ALIASES.get(text, text)


def positive_or_zero(text: str) -> int:
    """An int flag that takes 0 or more (argparse says so when it does not)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


MODEL, ENGINE = "model", "engine"  # the flags' groups in --help (PARALLEL: parallel_config.py)
OVERLAP_MODES = ("auto", "on", "off")
# The prefill budget when --max-prefill-length is not set, per device: the most prompt tokens one
# step computes. On a GPU, Mini-SGLang's default (its --max-extend-tokens): a step of that many
# tokens of a small model takes tens of milliseconds. On the CPU a step of a few hundred tokens of
# the default model takes seconds, and every running stream waits for it (issue 29: a 3,000-token
# prompt in one step held every stream for 33 s): small chunks keep their tokens coming.
GPU_PREFILL_BUDGET = 16384
CPU_PREFILL_BUDGET = 256
KV_CACHE_DTYPES = ("auto", "bf16", "fp8_e4m3")  # core/devices.py maps them to torch dtypes


@dataclass
class EngineConfig(ParallelOptions):
    model: str | None = option(
        None, "Hugging Face model folder or hub id; default: SmolLM2-135M-Instruct", group=MODEL
    )
    device: str = option("auto", "cpu, cuda, cuda:N or auto (CUDA when available)", group=MODEL)
    dtype: str = option(
        "auto",
        "weights and activations; auto: float32 on the CPU, the checkpoint's (bf16 for fp32 ones) on a GPU",
        group=MODEL,
        choices=DTYPES,
        parse=dtype_name,  # half, float (vLLM's and SGLang's names) are accepted too
    )
    max_seq_len_override: int | None = option(
        None,
        "cap the context length (prompt + answer) below the model's own",
        group=MODEL,
        aliases=("--max-model-len", "--context-length"),
    )
    seed: int | None = option(
        None,
        "seed of the random stream shared by requests that set no seed of their own, so a whole run "
        "is reproducible; default: not seeded (a request's own seed always gives it a private stream)",
        group=MODEL,
        aliases=("--random-seed",),
    )
    trust_remote_code: bool = option(
        False,
        "accepted so that vLLM and SGLang command lines run; changes nothing: this engine runs its "
        "own code for each architecture it supports and never code from the model folder",
        group=MODEL,
    )
    threads: int | None = option(
        None,
        "PyTorch threads on the CPU; default: one per CPU this process may use, less one "
        "(OMP_NUM_THREADS, when set, is used as it is)",
        group=MODEL,
    )
    # The help lists the backends from their registry (args.py): core/ knows none of them.
    attn: str = option("auto", "attention backend:", group=ENGINE)
    page_size: int | None = option(
        None,
        "tokens per KV-cache page; default: 1, or what the attention kernels need:",
        group=ENGINE,
        aliases=("--block-size",),
    )
    num_pages: int | None = option(
        None,
        "KV-cache pages; default: what --memory-ratio leaves on a GPU, 32768 tokens on the CPU",
        group=ENGINE,
        aliases=("--num-gpu-blocks-override",),
    )
    memory_ratio: float = option(
        0.9,
        "share of GPU memory for weights + KV cache; the rest is for activations",
        group=ENGINE,
        aliases=("--gpu-memory-utilization", "--mem-fraction-static"),
    )
    max_running_requests: int = option(
        256,
        "most requests holding KV cache at once (decoding together)",
        group=ENGINE,
        aliases=("--max-num-seqs",),
    )
    max_prefill_length: int | None = option(
        None,
        "prompt tokens one step may compute (chunked prefill): a longer prompt is cut into "
        "chunks over several steps, and every step still carries the running requests' decodes "
        "(--chunk-policy mixed), so the budget bounds how long a long prompt holds the others; a "
        f"large value turns chunking off. Default: {GPU_PREFILL_BUDGET} on a GPU (Mini-SGLang's), "
        f"{CPU_PREFILL_BUDGET} on the CPU, where a step of a few hundred prompt tokens already takes seconds",
        group=ENGINE,
        aliases=("--max-num-batched-tokens", "--chunked-prefill-size"),
    )
    chunk_policy: str = option(
        "mixed",
        "mixed: every step carries one token per decoding request plus prefill chunks up to "
        "the budget; prefill-first: steps with prefill work carry only prefill. Measured "
        "(docs/serving/performance.md): both give earlier first tokens than Mini-SGLang's on an "
        "H200, prefill-first the earlier of the two, mixed the steadier streams (a prompt's step "
        "does not stall the decodes)",
        group=ENGINE,
    )
    cache: str = option(
        "radix",
        "prefix cache: radix reuses the KV of shared prompt prefixes; naive recomputes every prompt",
        group=ENGINE,
        aliases=("--cache-type",),
        presets=(
            Preset("--enable-prefix-caching", "radix", "the same as --cache radix (vLLM)", negated="naive"),
            Preset("--disable-radix-cache", "naive", "the same as --cache naive (SGLang)"),
        ),
    )
    kv_cache_dtype: str = option(
        "auto",
        "what the KV cache stores: auto: the model's dtype; bf16; fp8_e4m3: FP8 (E4M3) with one "
        "scale per layer for K and one for V (the checkpoint's k_scale/v_scale, else 1.0), twice the "
        "tokens in the same memory; the start-up log says the dtype and the tokens",
        group=ENGINE,
        choices=KV_CACHE_DTYPES,
    )
    cuda_graph_max_bs: int | None = option(
        None,
        "largest decode batch captured in a CUDA graph (sizes 1, 2, 4, 8, then every 8); 0: off, "
        "decode steps run eagerly; default: min(--max-running-requests, 256) on a GPU. Ignored on "
        "the CPU (one log line)",
        group=ENGINE,
        parse=positive_or_zero,
        presets=(
            Preset("--enforce-eager", 0, "the same as --cuda-graph-max-bs 0 (vLLM)"),
            Preset("--disable-cuda-graph", 0, "the same as --cuda-graph-max-bs 0 (SGLang)"),
        ),
    )
    piecewise_cuda_graph_max_tokens: int | None = option(
        None,
        "largest prefill step (tokens) replayed from CUDA graphs piece by piece, attention eager "
        "between (engine/prefill_graph.py): a prompt's first token sooner. 0: off; default: every "
        "step size on one GPU, off with --cuda-graph-max-bs 0 and under --tp; ignored on the CPU",
        group=ENGINE,
        parse=positive_or_zero,
        presets=(Preset("--disable-piecewise-cuda-graph", 0, "the same as 0 (SGLang)"),),
    )
    overlap: str = option(
        "auto",
        "overlap scheduling: the host schedules and prepares step N+1 while the GPU runs step N; "
        "auto: on on a GPU, off on the CPU (where nothing runs asynchronously)",
        group=ENGINE,
        choices=OVERLAP_MODES,
        presets=(
            Preset("--disable-overlap", "off", "the same as --overlap off"),
            Preset("--disable-overlap-schedule", "off", "the same as --overlap off (SGLang)"),
        ),
    )
    warmup: str = option(
        "auto",
        "prefill steps of the budget's size at start, on no request, so that the first requests do "
        "not pay the kernels' first-use costs (engine/warmup.py); auto: on on a GPU, off on the CPU",
        group=ENGINE,
        choices=OVERLAP_MODES,
        presets=(Preset("--skip-server-warmup", "off", "the same as --warmup off (SGLang)"),),
    )

    def __post_init__(self) -> None:
        self.dtype = dtype_name(self.dtype)  # LLM(dtype="half") as vLLM takes it
        self.validate()

    def validate(self) -> None:
        """What needs no model, no machine and no registry (resolve.py checks the names)."""
        checks: list[tuple[bool, str]] = [
            (
                self.page_size is None or self.page_size >= 1,
                f"--page-size must be >= 1, got {self.page_size}",
            ),
            (
                self.num_pages is None or self.num_pages >= 1,
                f"--num-pages must be >= 1, got {self.num_pages}",
            ),
            (0 < self.memory_ratio <= 1, f"--memory-ratio must be in (0, 1], got {self.memory_ratio}"),
            (
                self.max_running_requests >= 1,
                f"--max-running-requests must be >= 1, got {self.max_running_requests}",
            ),
            (
                self.max_prefill_length is None or self.max_prefill_length >= 1,
                f"--max-prefill-length must be >= 1, got {self.max_prefill_length}",
            ),
            (
                self.max_seq_len_override is None or self.max_seq_len_override >= 2,
                f"--max-seq-len-override must be >= 2, got {self.max_seq_len_override}",
            ),
            (
                self.cuda_graph_max_bs is None or self.cuda_graph_max_bs >= 0,
                f"--cuda-graph-max-bs must be >= 0, got {self.cuda_graph_max_bs}",
            ),
            (
                self.dtype in DTYPES,
                f"--dtype must be one of {', '.join(DTYPES)} (or half, float), got {self.dtype!r}",
            ),
            (self.threads is None or self.threads >= 1, f"--threads must be >= 1, got {self.threads}"),
            (
                self.kv_cache_dtype in KV_CACHE_DTYPES,
                f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}",
            ),
            (
                self.overlap in OVERLAP_MODES,
                f"--overlap must be one of {', '.join(OVERLAP_MODES)}, got {self.overlap!r}",
            ),
        ]
        for ok, message in checks + self.parallel_checks():
            if not ok:
                raise UserError(message)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Like EngineConfig(**kwargs), but also under vLLM's and SGLang's names
        (`tensor_parallel_size=2`, `max_model_len=...`, `enforce_eager=True`); an unknown keyword
        is a UserError naming the known ones."""
        return cls(**from_keywords(cls, kwargs))
