"""Building the backends an `AttentionChoice` names, from their descriptors (registry.py): a
backend's module is imported only when it is built (FlashInfer's, for instance, imports
flashinfer), and one backend per phase is wrapped in a HybridBackend."""

from __future__ import annotations

import importlib

from ..core.model_config import ModelConfig
from ..kvcache.page_table import PageTable
from ..kvcache.pool import KVPool
from .base import AttentionBackend, HybridBackend
from .choose import AttentionChoice
from .registry import BACKENDS
from .spec import BackendSpec, Factory, Library


def backend_class(spec: BackendSpec) -> Factory:
    if not isinstance(spec.factory, str):
        return spec.factory
    module, _, name = spec.factory.partition(":")
    return getattr(importlib.import_module(module), name)


def create_backend(
    choice: AttentionChoice,
    config: ModelConfig,
    pool: KVPool,
    page_table: PageTable,
    num_heads: int | None = None,
) -> AttentionBackend:
    """The backend(s) of a resolved choice over this pool; `num_heads`: query heads on this rank
    (default: all)."""
    heads = num_heads or config.num_heads
    libraries: dict[str, Library | None] = {choice.prefill: choice.prefill_library}
    libraries[choice.decode] = choice.decode_library
    built = {
        name: backend_class(BACKENDS[name])(config, pool, page_table, heads, library)
        for name, library in libraries.items()
    }
    if choice.prefill == choice.decode:
        return built[choice.prefill]
    return HybridBackend(built[choice.prefill], built[choice.decode])
