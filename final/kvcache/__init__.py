"""The KV cache: the page pool on the device, the free-page allocator and the page table, and the
prefix cache that decides which finished requests' pages are kept for reuse.

    KVPool          K and V tensors of every layer, in pages of `page_size` tokens (pool.py)
    PageAllocator   the free list of page ids (allocator.py)
    PageTable       per request row, the pages holding its tokens, on the device (page_table.py)
    PrefixCache     reuse of shared prompt prefixes: the interface and `naive` (prefix_cache.py)
    RadixCache      `radix`, the default: a radix tree over token ids (radix_cache.py)
    registry        `--cache NAME` -> class, and the default (registry.py)
    KVCacheManager  a request's pages: admit, grow, cache, release (manager.py)
"""
