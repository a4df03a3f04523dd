"""Prefix caches: which pages of finished requests are kept, so a later prompt that starts with
the same tokens reuses their K and V instead of recomputing them.

The interface is the one a radix tree needs (stage 03 teaches it): `match` the longest cached
prefix of a prompt and lock it while a request uses it; `insert` a finished request's pages;
`evict` unlocked pages when the pool runs dry. `naive` keeps nothing: every request computes its
whole prompt and frees its pages when it finishes. Pick one with `--cache NAME`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import NotAvailableYet, UserError


@dataclass
class PrefixMatch:
    num_tokens: int = 0  # prompt tokens whose KV is reused (page-aligned)
    pages: list[int] = field(default_factory=list)  # the pages that hold them, in order
    handle: Any = None  # what the cache needs back to unlock the match


class PrefixCache(ABC):
    def __init__(self, page_size: int):
        self.page_size = page_size

    @abstractmethod
    def match(self, token_ids: Sequence[int]) -> PrefixMatch:
        """The longest cached prefix of `token_ids`, locked against eviction until `unlock`."""

    @abstractmethod
    def unlock(self, match: PrefixMatch) -> None:
        """The request that matched is done with those pages (they stay cached, evictable)."""

    @abstractmethod
    def insert(self, token_ids: Sequence[int], pages: list[int], match: PrefixMatch) -> list[int]:
        """Offer a request's pages (holding the KV of `token_ids`, the first ones from `match`).
        Return the pages the cache does not keep; the caller frees them."""

    @abstractmethod
    def evict(self, num_pages: int) -> list[int]:
        """Give up to `num_pages` unlocked pages back (least recently used first)."""

    @property
    @abstractmethod
    def num_evictable_pages(self) -> int: ...

    @property
    @abstractmethod
    def num_cached_pages(self) -> int:
        """Pages the cache holds, locked or not."""


class NaivePrefixCache(PrefixCache):
    """No reuse: matches nothing, keeps nothing."""

    def match(self, token_ids: Sequence[int]) -> PrefixMatch:
        return PrefixMatch()

    def unlock(self, match: PrefixMatch) -> None:
        pass

    def insert(self, token_ids: Sequence[int], pages: list[int], match: PrefixMatch) -> list[int]:
        return list(pages)

    def evict(self, num_pages: int) -> list[int]:
        return []

    @property
    def num_evictable_pages(self) -> int:
        return 0

    @property
    def num_cached_pages(self) -> int:
        return 0


def _not_ported(name: str, stage: str) -> Callable[[int], PrefixCache]:
    def factory(page_size: int) -> PrefixCache:
        raise NotAvailableYet(f"--cache {name} is not available in final/ yet ({stage}); use --cache naive")

    return factory


# --cache NAME -> factory(page_size). The radix tree lands here when stage 03 is ported.
PREFIX_CACHES: dict[str, Callable[[int], PrefixCache]] = {
    "naive": NaivePrefixCache,
    "radix": _not_ported("radix", "the radix tree of stage 03 is being ported"),
}


def create_prefix_cache(name: str, page_size: int) -> PrefixCache:
    if name not in PREFIX_CACHES:
        raise UserError(f"unknown prefix cache {name!r}; choose from {', '.join(PREFIX_CACHES)}")
    return PREFIX_CACHES[name](page_size)
