"""Prefix caches: KV pages that earlier requests computed, found again by their tokens, so a later
prompt that starts with the same tokens reuses their K and V instead of recomputing them.

The interface is the one a radix tree needs (stage 03 teaches it): `match` the longest cached
prefix of a prompt; `lock` it while a request uses it; `insert` a request's pages once its prompt
is prefilled and when it finishes; `evict` unlocked pages when the pool runs dry. The cache never
touches the allocator: `insert` and `evict` say which pages the caller frees. `radix` (the
default, radix_cache.py) reuses prefixes; `naive` keeps nothing. Pick one with `--cache NAME`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

Handle = Any  # what a cache gives back from `match` and `insert`, to lock and unlock later


@dataclass
class PrefixMatch:
    pages: list[int] = field(default_factory=list)  # the cached pages of the prefix, in order
    handle: Handle = None  # the end of the prefix in the cache, to lock and unlock
    page_size: int = 1

    @property
    def num_tokens(self) -> int:
        """Prompt tokens whose KV is reused (a whole number of pages)."""
        return len(self.pages) * self.page_size


class PrefixCache(ABC):
    reuses_prefixes = False

    def __init__(self, page_size: int):
        self.page_size = page_size

    @abstractmethod
    def match(self, token_ids: Sequence[int]) -> PrefixMatch:
        """The longest cached prefix of `token_ids` (whole pages). Not locked: call `lock`."""

    @abstractmethod
    def lock(self, handle: Handle) -> None:
        """A live request uses the prefix ending at `handle`: none of its pages may be evicted."""

    @abstractmethod
    def unlock(self, handle: Handle) -> None: ...

    @abstractmethod
    def insert(self, token_ids: Sequence[int], pages: list[int]) -> tuple[list[int], Handle]:
        """Offer the pages holding the KV of `token_ids` (whole pages only). Return the pages the
        cache now holds for them (its own where it had them already) and the handle of their end.
        An offered page that differs from the returned one is a duplicate: the caller frees it.
        An empty list: the cache kept nothing, the pages stay the caller's."""

    @abstractmethod
    def evict(self, num_pages: int) -> list[int]:
        """Drop at least `num_pages` unlocked pages if there are that many, least recently used
        first; return them (the caller frees them)."""

    @property
    @abstractmethod
    def evictable_pages(self) -> int:
        """Cached pages no live request uses."""

    @property
    def num_cached_pages(self) -> int:
        """Pages the cache holds, locked or not."""
        return len(self.all_pages())

    @abstractmethod
    def prefix(self, handle: Handle) -> tuple[list[int], list[int]]:
        """The tokens and pages of the prefix that ends at `handle` (read only)."""

    @abstractmethod
    def all_pages(self) -> list[int]: ...

    @abstractmethod
    def check_integrity(self, locks: Iterable[Handle]) -> None:
        """Raise AssertionError unless the cache is consistent and `locks` are all the locks held."""


class NaiveCache(PrefixCache):
    """No reuse (`--cache naive`): matches nothing, keeps nothing."""

    def match(self, token_ids: Sequence[int]) -> PrefixMatch:
        return PrefixMatch(page_size=self.page_size)

    def lock(self, handle: Handle) -> None:
        pass

    def unlock(self, handle: Handle) -> None:
        pass

    def insert(self, token_ids: Sequence[int], pages: list[int]) -> tuple[list[int], Handle]:
        return [], None

    def evict(self, num_pages: int) -> list[int]:
        return []

    @property
    def evictable_pages(self) -> int:
        return 0

    def prefix(self, handle: Handle) -> tuple[list[int], list[int]]:
        return [], []

    def all_pages(self) -> list[int]:
        return []

    def check_integrity(self, locks: Iterable[Handle]) -> None:
        assert all(h is None for h in locks), "the naive cache hands out no handles"
