"""Pages for requests: allocation (evicting from the prefix cache when the free list runs dry),
prefix matching at admission, and release when a request finishes or is preempted."""

from __future__ import annotations

from collections.abc import Sequence

from .allocator import PageAllocator
from .prefix_cache import PrefixCache, PrefixMatch


class KVCacheManager:
    def __init__(self, num_pages: int, page_size: int, prefix_cache: PrefixCache):
        self.allocator = PageAllocator(num_pages)
        self.prefix_cache = prefix_cache
        self.num_pages, self.page_size = num_pages, page_size

    @property
    def num_free_pages(self) -> int:
        return self.allocator.num_free

    @property
    def num_available_pages(self) -> int:
        """Pages a request could get now: free ones, plus cached ones nobody is using."""
        return self.allocator.num_free + self.prefix_cache.num_evictable_pages

    def match(self, token_ids: Sequence[int]) -> PrefixMatch:
        # Never match the whole prompt: the last prompt token must run through the model to give
        # the logits of the first new token.
        return self.prefix_cache.match(token_ids[:-1])

    def allocate(self, count: int) -> list[int] | None:
        if count > self.allocator.num_free:
            self.allocator.free(self.prefix_cache.evict(count - self.allocator.num_free))
        return self.allocator.allocate(count)

    def release(self, token_ids: Sequence[int], pages: list[int], match: PrefixMatch) -> None:
        """A request gives back its pages; `token_ids` are the tokens whose KV they hold."""
        self.prefix_cache.unlock(match)
        self.allocator.free(self.prefix_cache.insert(token_ids, pages, match))

    def check_integrity(self, pages_in_use: int) -> None:
        """Every page is free, cached, or held by a live request: exactly one of them."""
        total = self.allocator.num_free + self.prefix_cache.num_cached_pages + pages_in_use
        assert total == self.num_pages, f"KV pages leaked or double-counted: {total} != {self.num_pages}"
