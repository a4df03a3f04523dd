"""The KV cache manager owns every request's pages: admission (the prefix match, its lock and the
first pages), growth as the request gets longer, handing whole pages to the prefix cache, and
release. The page size and its round-up arithmetic live here and nowhere else.

A request's pages are described by a `RequestPages` (its page-table row, its pages in order, how
many of them are the prefix cache's); the scheduler decides *when* to call the manager, the manager
decides *which* pages.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .allocator import PageAllocator
from .page_table import PageTable
from .prefix_cache import Handle, PrefixCache, PrefixMatch


@dataclass
class RequestPages:
    row: int = -1  # the request's row in the page table while it holds pages
    pages: list[int] = field(default_factory=list)  # every page holding its tokens, in order
    # pages[:num_shared] belong to the prefix cache, locked through `handle` while the request runs;
    # the rest are the request's own, freed when it leaves.
    num_shared: int = 0
    handle: Handle = None

    @property
    def own_pages(self) -> list[int]:
        return self.pages[self.num_shared :]

    @property
    def holds_pages(self) -> bool:
        return self.row >= 0


class KVCacheManager:
    def __init__(self, num_pages: int, page_size: int, prefix_cache: PrefixCache, page_table: PageTable):
        self.allocator = PageAllocator(num_pages)
        self.prefix_cache = prefix_cache
        self.page_table = page_table
        self.num_pages, self.page_size = num_pages, page_size

    def pages_for(self, num_tokens: int) -> int:
        """Pages that hold `num_tokens` tokens (the one round-up in the engine)."""
        return -(-num_tokens // self.page_size)

    @property
    def capacity(self) -> int:
        """Tokens the pool holds."""
        return self.num_pages * self.page_size

    @property
    def num_free_pages(self) -> int:
        return self.allocator.num_free

    @property
    def num_available_pages(self) -> int:
        """Pages a request could get now: free ones, plus cached ones nobody is using."""
        return self.allocator.num_free + self.prefix_cache.evictable_pages

    def match(self, token_ids: Sequence[int]) -> PrefixMatch:
        # Never match the whole prompt: the last prompt token must run through the model to give
        # the logits of the first new token.
        return self.prefix_cache.match(token_ids[:-1])

    def admit(self, kv: RequestPages, match: PrefixMatch, length: int, reserve: int = 0) -> bool:
        """Give a waiting request a row whose first pages are the matched prefix's, and room for
        `length` tokens, keeping `reserve` pages available for others. False (nothing changed) if
        the pool cannot, or no row is free: a finished request keeps its row until the step in
        flight that may still read it is done (Scheduler.finish's defer_release), so fewer running
        requests than rows does not mean a free row."""
        if not self.page_table.num_free_rows:
            return False
        self.prefix_cache.lock(match.handle)  # before anything is evicted to make room for the rest
        need = self.pages_for(length) - len(match.pages)
        if need > self.num_available_pages - reserve:
            self.prefix_cache.unlock(match.handle)
            return False
        kv.row = self.page_table.acquire_row()
        self.page_table.write(kv.row, 0, match.pages)
        kv.pages, kv.num_shared, kv.handle = list(match.pages), len(match.pages), match.handle
        grown = self.grow(kv, length)
        assert grown, "the pages were counted above"
        return True

    def grow(self, kv: RequestPages, length: int) -> bool:
        """Give the request enough pages to hold `length` tokens; False if the pool cannot."""
        if length <= len(kv.pages) * self.page_size:
            return True  # the usual case (every decode step of every request): nothing to add
        need = self.pages_for(length) - len(kv.pages)
        pages = self._allocate(need)
        if pages is None:
            return False
        self.page_table.write(kv.row, len(kv.pages), pages)
        kv.pages.extend(pages)
        return True

    def _allocate(self, count: int) -> list[int] | None:
        if count > self.allocator.num_free:
            self.allocator.free(self.prefix_cache.evict(count - self.allocator.num_free))
        return self.allocator.allocate(count)

    def cache(self, kv: RequestPages, token_ids: Sequence[int], num_computed: int) -> None:
        """Offer the request's whole computed pages (holding `token_ids[:num_computed]`) to the prefix
        cache. Where the cache already holds the same tokens, the request switches to the cache's
        pages and frees its duplicates."""
        count = num_computed // self.page_size
        held, handle = self.prefix_cache.insert(token_ids[: count * self.page_size], kv.pages[:count])
        if not held:
            return  # the cache kept nothing: the pages stay the request's own
        self.prefix_cache.lock(handle)
        self.prefix_cache.unlock(kv.handle)
        start = kv.num_shared  # pages before it were the cache's already
        mine = kv.pages[start : len(held)]
        duplicates = [page for page, kept in zip(mine, held[start:], strict=True) if page != kept]
        if duplicates:
            self.allocator.free(duplicates)
            self.page_table.write(kv.row, start, held[start:])
        kv.pages[: len(held)] = held
        kv.num_shared, kv.handle = len(held), handle

    def release(self, kv: RequestPages) -> None:
        """Free the request's own pages and its row, and unlock the cache's (the cache keeps those)."""
        self.allocator.free(kv.own_pages)
        self.prefix_cache.unlock(kv.handle)
        self.page_table.release_row(kv.row)
        kv.row, kv.pages, kv.num_shared, kv.handle = -1, [], 0, None

    def check_integrity(self, live: Iterable[RequestPages]) -> None:
        """Every page is free, held by the prefix cache, or owned by one live request: exactly one
        of them; the cache's locks are exactly the live requests'; each live request's shared pages
        are the cache's pages of its prefix. AssertionError otherwise."""
        live = list(live)
        free, cached = list(self.allocator.free_pages), self.prefix_cache.all_pages()
        owned = [p for kv in live for p in kv.own_pages]
        every = free + cached + owned
        assert len(every) == len(set(every)), "a KV page is held twice"
        assert len(every) == self.num_pages, (
            f"KV pages leaked: {len(free)} free + {len(cached)} cached + {len(owned)} owned != {self.num_pages}"
        )
        self.prefix_cache.check_integrity([kv.handle for kv in live])
        for kv in live:
            _, pages = self.prefix_cache.prefix(kv.handle)
            assert pages == kv.pages[: kv.num_shared], "a request's shared pages are not the cache's"
        rows = [kv.row for kv in live]
        assert len(rows) == len(set(rows)) and all(0 <= r < self.page_table.padding_row for r in rows)
        assert len(rows) + self.page_table.num_free_rows == self.page_table.max_requests, (
            "a page-table row leaked"
        )
