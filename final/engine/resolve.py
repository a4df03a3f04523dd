"""Every choice of an engine, made once: `resolve_config(config)` turns what the user asked for
(EngineConfig, left as it is) into a frozen ResolvedConfig that the parts of the engine read and
none derives again: the model and its config, the device and the dtype, the attention backends
and the page size they take, whether decode steps are captured in CUDA graphs, whether the loop
overlaps, and what tensor parallelism needs of the machine.

`validate_early` runs the checks that need no model and no GPU, in the frontend, before it starts
anything.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from ..attention.choose import AttentionChoice, resolve_attention
from ..core.config import CPU_PREFILL_BUDGET, GPU_PREFILL_BUDGET, EngineConfig
from ..core.devices import DTYPES, pick_device, pick_dtype, pick_kv_dtype
from ..core.errors import UserError
from ..core.model_config import ModelConfig
from ..distributed.group import parse_address
from ..kvcache.registry import create_prefix_cache
from ..models.loader import check_tp_degree
from ..models.registry import read_model_config
from ..models.source import resolve_model
from ..scheduler.policy import create_policy
from .graph import AUTO_MAX_BATCH
from .prefill_graph import override_max_tokens

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedConfig:
    """An engine's settings with every `auto` and default decided (see the module docstring)."""

    model_dir: Path
    model: ModelConfig
    device: torch.device  # rank 0's; rank i of a node runs on cuda:i
    dtype: torch.dtype
    kv_dtype: torch.dtype  # what the KV pool stores (kvcache/pool.py: fp8 with per-layer scales)
    attention: AttentionChoice  # the backend (and kernel library) of each phase
    page_size: int  # tokens per KV page: the user's, or what the attention kernels take
    num_pages: int | None  # None: what memory leaves (measured once the weights are loaded)
    memory_ratio: float
    max_running_requests: int
    max_prefill_length: int
    chunk_policy: str
    cache: str
    graph_max_batch: int | None  # the largest decode batch captured; None: decode runs eagerly
    prefill_graph_tokens: int | None  # the largest prefill step replayed piecewise; None: eager prefill
    overlap: bool  # schedule step N+1 while step N runs (engine/core.py)
    tp: int
    nnodes: int
    dist_init_addr: str | None
    dist_timeout: float
    threads: int | None = None  # --threads: PyTorch threads on the CPU (None: core/devices.py's rule)
    seed: int | None = None  # --seed: of the random stream unseeded requests share
    warmup: bool = False  # prefill steps on the padding row at start (engine/warmup.py)

    @property
    def ranks_per_node(self) -> int:
        return self.tp // self.nnodes


def resolve_config(config: EngineConfig, model_dir: Path | None = None) -> ResolvedConfig:
    """Resolve `config` for this machine (a UserError says what cannot work, before any weight is
    read); `model_dir` when the caller has resolved --model already."""
    folder = Path(model_dir) if model_dir is not None else resolve_model(config.model)
    model = read_model_config(folder, config.max_seq_len_override)
    device = pick_device(config.device)
    dtype = pick_dtype(config.dtype, model.dtype, device)
    kv_dtype = pick_kv_dtype(config.kv_cache_dtype, dtype)
    # Fail on a bad --attn, --cache, --chunk-policy or --tp before spending time on the weights.
    attention = resolve_attention(
        config.attn, device, dtype, config.page_size, head_dim=model.head_dim, kv_dtype=kv_dtype
    )
    create_prefix_cache(config.cache, attention.page_size)
    create_policy(config.chunk_policy)
    check_tp(config, device)
    check_tp_degree(model, config.tp)
    if config.trust_remote_code:
        log.info("--trust-remote-code changes nothing here: no code from the model folder ever runs")
    if config.tp > 1 and device.type == "cuda":
        device = torch.device("cuda", 0)  # rank i on cuda:i
    budget = config.max_prefill_length or default_prefill_budget(device)
    return ResolvedConfig(
        model_dir=folder,
        model=model,
        device=device,
        dtype=dtype,
        kv_dtype=kv_dtype,
        attention=attention,
        page_size=attention.page_size,
        num_pages=config.num_pages,
        memory_ratio=config.memory_ratio,
        max_running_requests=config.max_running_requests,
        max_prefill_length=budget,
        chunk_policy=config.chunk_policy,
        cache=config.cache,
        graph_max_batch=graph_max_batch(config, device),
        prefill_graph_tokens=prefill_graph_tokens(config, device, budget),
        overlap=on_here(config.overlap, device),
        tp=config.tp,
        nnodes=config.nnodes,
        dist_init_addr=config.dist_init_addr,
        dist_timeout=config.dist_timeout,
        threads=config.threads,
        seed=config.seed,
        warmup=on_here(config.warmup, device),
    )


def on_here(mode: str, device: torch.device) -> bool:
    """An `auto|on|off` switch (--overlap, --warmup) on this device: auto is on on a GPU only."""
    return mode == "on" or (mode == "auto" and device.type == "cuda")


def default_prefill_budget(device: torch.device) -> int:
    """--max-prefill-length when it is not set: see GPU_PREFILL_BUDGET and CPU_PREFILL_BUDGET."""
    return GPU_PREFILL_BUDGET if device.type == "cuda" else CPU_PREFILL_BUDGET


def graph_max_batch(config: EngineConfig, device: torch.device) -> int | None:
    """The largest decode batch to capture, or None for eager decode (with one log line why).
    The attention backend may still refuse graphs once it is built (the executor logs that)."""
    max_bs = config.cuda_graph_max_bs
    if max_bs == 0:
        return None
    if device.type != "cuda":
        if max_bs:
            log.info("--cuda-graph-max-bs %d ignored on the CPU: CUDA graphs need a GPU", max_bs)
        return None
    auto = min(config.max_running_requests, AUTO_MAX_BATCH)
    return min(max_bs or auto, config.max_running_requests)


def prefill_graph_tokens(config: EngineConfig, device: torch.device, budget: int) -> int | None:
    """The largest prefill step to replay piecewise (engine/prefill_graph.py), or None for eager
    prefill steps. FINAL_PREFILL_GRAPHS, where set, overrides the flag (the benchmarks' A/B
    switch); by default every step: a full budget plus one decode token a running request, the
    step buffers' size. Off with decode graphs off (--cuda-graph-max-bs 0, --enforce-eager: no
    graphs at all) unless the flag asks, and on the CPU (one log line where asked); under --tp
    only where asked (each rank records the same pieces, NCCL's all-reduces inside them as in the
    decode graphs; not yet measured there: benchmarks/GPU_PLAN.md)."""
    asked = override_max_tokens()
    if asked is None:
        asked = config.piecewise_cuda_graph_max_tokens
    if asked is None:
        default = config.cuda_graph_max_bs != 0 and device.type == "cuda" and config.tp == 1
        return budget + config.max_running_requests if default else None
    if asked < 0:
        raise UserError(f"--piecewise-cuda-graph-max-tokens must be >= 0, got {asked}")
    if asked == 0:
        return None
    if device.type != "cuda":
        log.info("piecewise prefill graphs (%d tokens) ignored: they run on CUDA GPUs", asked)
        return None
    return asked


def check_tp(config: EngineConfig, device: torch.device) -> None:
    """What --tp, --nnodes and --dist-init-addr need of the machine (the model's check is
    models.loader.check_tp_degree)."""
    if config.dist_init_addr is not None:
        parse_address(config.dist_init_addr)
    if config.node_rank > 0:
        raise UserError(
            "a node other than node 0 runs no engine of its own: start it with `python -m final "
            "--node-rank K ...`, which starts its ranks for node 0's engine"
        )
    if config.tp == 1 or device.type != "cuda":
        return
    if device.index is not None:
        raise UserError(
            f"--device {device}: under --tp, rank i runs on cuda:i of its node; use --device cuda "
            "(CUDA_VISIBLE_DEVICES chooses the GPUs)"
        )
    per_node, visible = config.ranks_per_node, torch.cuda.device_count()
    if visible < per_node:
        raise UserError(f"--tp {config.tp} needs {per_node} GPUs on this node; PyTorch sees {visible}")


def validate_early(config: EngineConfig) -> None:
    """The checks that need no model: run them in the frontend before spawning anything."""
    config.validate()
    device = pick_device(config.device)
    dtype = DTYPES.get(config.dtype)  # None for auto, which is never float32 on CUDA
    # The KV cache's dtype, where it is known without the model (auto's is the model's dtype).
    kv_dtype = None
    if dtype is not None or config.kv_cache_dtype != "auto":
        kv_dtype = pick_kv_dtype(config.kv_cache_dtype, dtype or torch.bfloat16)
    # Not probing the GPU: the frontend process must not create a CUDA context. The engine process
    # checks the compute capability.
    resolve_attention(config.attn, device, dtype, config.page_size, probe_gpu=False, kv_dtype=kv_dtype)
    create_prefix_cache(config.cache, config.page_size or 1)
    create_policy(config.chunk_policy)
    check_tp(config, device)
