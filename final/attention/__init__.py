"""Attention backends, chosen by name: `--attn NAME`, `--attn PREFILL,DECODE`, or `--attn auto`.

    torch    gathers pages and calls scaled_dot_product_attention; CPU and GPU; the reference
    fi       FlashInfer's paged prefill and decode wrappers (flashinfer-python; CUDA)
    fa       FlashAttention: 4 (flash-attn-4) on Hopper and Blackwell, else 3 or 2 (fa_backend.py)
    trtllm   FlashInfer's TensorRT-LLM kernels: decode on Hopper and Blackwell, prefill on
             Blackwell (10.x) only; pages of 16, 32 or 64 tokens (trtllm_backend.py)

choose.py resolves `auto` (its AUTO table) and the page size; support.py holds what each backend
needs and says so when the machine lacks it. A new backend is a subclass of AttentionBackend
(base.py), an entry in BACKENDS, and its needs in support.py.
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.attention_auto import AUTO, describe_auto
from ..core.model_config import ModelConfig
from ..kvcache import KVPool, PageTable
from .base import AttentionBackend, HybridBackend
from .choose import AttentionChoice, resolve_attention, resolve_names
from .support import Library

Factory = Callable[[ModelConfig, KVPool, PageTable, int, "Library | None"], AttentionBackend]


def _torch(config, pool, page_table, num_heads, library) -> AttentionBackend:
    from .torch_backend import TorchBackend

    return TorchBackend(config, pool, page_table, num_heads)


def _flashinfer(config, pool, page_table, num_heads, library) -> AttentionBackend:
    from .flashinfer_backend import FlashInferBackend  # imports flashinfer only when asked for

    return FlashInferBackend(config, pool, page_table, num_heads)


def _flash_attention(config, pool, page_table, num_heads, library) -> AttentionBackend:
    from .fa_backend import FlashAttentionBackend

    return FlashAttentionBackend(config, pool, page_table, num_heads, library)


def _trtllm(config, pool, page_table, num_heads, library) -> AttentionBackend:
    from .trtllm_backend import TrtllmBackend

    return TrtllmBackend(config, pool, page_table, num_heads, library)


BACKENDS: dict[str, Factory] = {"torch": _torch, "fi": _flashinfer, "fa": _flash_attention, "trtllm": _trtllm}


def create_backend(
    spec: str, config: ModelConfig, pool: KVPool, page_table: PageTable, num_heads: int | None = None
) -> AttentionBackend:
    """The backend(s) `spec` names for this pool's device, dtype and page size; `num_heads`:
    query heads on this rank (default: all)."""
    choice = resolve_attention(spec, pool.k.device, pool.k.dtype, pool.page_size, head_dim=config.head_dim)
    heads = num_heads or config.num_heads
    libraries = {choice.prefill: choice.prefill_library, choice.decode: choice.decode_library}
    built = {name: BACKENDS[name](config, pool, page_table, heads, lib) for name, lib in libraries.items()}
    if choice.prefill == choice.decode:
        return built[choice.prefill]
    return HybridBackend(built[choice.prefill], built[choice.decode])


__all__ = [
    "AUTO",
    "AttentionBackend",
    "AttentionChoice",
    "BACKENDS",
    "HybridBackend",
    "create_backend",
    "describe_auto",
    "resolve_attention",
    "resolve_names",
]
