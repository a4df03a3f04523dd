"""`--cache NAME` -> the prefix cache class. `radix` is the default (EngineConfig.cache)."""

from __future__ import annotations

from collections.abc import Callable

from ..core.errors import UserError
from .prefix_cache import NaiveCache, PrefixCache
from .radix_cache import RadixCache

PREFIX_CACHES: dict[str, Callable[[int], PrefixCache]] = {
    "radix": RadixCache,
    "naive": NaiveCache,
}


def create_prefix_cache(name: str, page_size: int) -> PrefixCache:
    if name not in PREFIX_CACHES:
        raise UserError(f"unknown prefix cache {name!r}; choose from {', '.join(PREFIX_CACHES)}")
    return PREFIX_CACHES[name](page_size)
