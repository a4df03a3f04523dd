"""The free list of KV pages. Allocation is all or nothing, so a failed request leaves no trace."""

from __future__ import annotations

from collections import deque


class PageAllocator:
    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self.free_pages: deque[int] = deque(range(num_pages))

    @property
    def num_free(self) -> int:
        return len(self.free_pages)

    def allocate(self, count: int) -> list[int] | None:
        if count > len(self.free_pages):
            return None
        return [self.free_pages.popleft() for _ in range(count)]

    def free(self, pages: list[int]) -> None:
        self.free_pages.extend(pages)
