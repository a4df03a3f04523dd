"""Pages for requests: allocation (evicting unused prefixes from the prefix cache when the free
list runs dry), prefix matching at admission, and the integrity check tests call."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .allocator import PageAllocator
from .prefix_cache import Handle, PrefixCache, PrefixMatch


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

    def free(self, pages: list[int]) -> None:
        self.allocator.free(pages)

    def check_integrity(self, owned: Iterable[int], locks: Iterable[Handle]) -> None:
        """Every page is free, held by the prefix cache, or owned by one live request: exactly one
        of them (`owned`: the live requests' own pages; `locks`: their handles into the cache)."""
        free, cached, owned = list(self.allocator.free_pages), self.prefix_cache.all_pages(), list(owned)
        every = free + cached + owned
        assert len(every) == len(set(every)), "a KV page is held twice"
        assert len(every) == self.num_pages, (
            f"KV pages leaked: {len(free)} free + {len(cached)} cached + {len(owned)} owned != {self.num_pages}"
        )
        self.prefix_cache.check_integrity(locks)
