"""The paged KV cache: one preallocated pool of fixed-size pages shared by every request.

Stage 01 gave each request a contiguous buffer sized for its whole life. Here the K and V of all
requests live in one pool of pages of `page_size` tokens; a request owns a list of pages (its
page table) and grows by one page at a time. Nothing is reserved that is not used, except the
unfilled end of each request's last page, and any free page can serve any request.
"""

from __future__ import annotations

from collections import deque

import torch

from stages.common.model_config import ModelConfig


# --8<-- [start:pool]
class KVPool:
    """K and V buffers for every layer: [num_pages, page_size, kv_heads, head_dim] each."""

    def __init__(self, config: ModelConfig, num_pages: int, page_size: int, device, dtype: torch.dtype):
        shape = (config.num_layers, num_pages, page_size, config.num_kv_heads, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.num_pages, self.page_size = num_pages, page_size

    def store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the K and V of T tokens [T, kv_heads, head_dim] at token slots [T], where slot
        = page * page_size + offset in the page."""
        self.k[layer].view(-1, *k.shape[1:])[slots] = k
        self.v[layer].view(-1, *v.shape[1:])[slots] = v

    @staticmethod
    def bytes_per_page(config: ModelConfig, page_size: int, dtype: torch.dtype) -> int:
        per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype.itemsize
        return per_token * page_size


# --8<-- [end:pool]


class PageAllocator:
    """A free list of page ids. Allocation is all or nothing, so a failed request leaves no trace."""

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
