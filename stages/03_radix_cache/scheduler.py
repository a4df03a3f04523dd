"""Continuous batching: which requests run in the next step.

Each step is either a prefill batch (newly admitted requests, whole prompts) or a decode batch
(one token for every running request). Prefill goes first, so new requests join the running set
as soon as there is room; finished requests leave after every step and free their pages at once.

With a prefix cache, admission first looks the request up in the cache: the matched pages become
the start of its page table and only the rest of the prompt is prefilled. A request hands its
whole pages to the cache once its prompt is prefilled and again when it finishes.
"""

from __future__ import annotations

import logging
from collections import deque

from .kv_cache import PageAllocator
from .page_table import PageTable
from .radix_cache import Handle, PrefixCache, RadixCache
from .request import Batch, Request, Status

log = logging.getLogger(__name__)

# Stage 02 prefills whole prompts; this caps the tokens of one prefill batch (activation memory
# grows with it). A single longer prompt still runs alone. Stage 04 makes this a real budget.
MAX_PREFILL_TOKENS = 16384
# A waiting request that shares at least this many uncached tokens with a request admitted in the
# same batch waits one step: once that request is prefilled, the shared tokens come from the cache
# instead of being computed twice. Short shared heads (a chat template's first tokens) are not
# worth the wait.
MIN_SHARED_TO_WAIT = 32


class Scheduler:
    def __init__(
        self, allocator: PageAllocator, page_table: PageTable, page_size: int, max_running: int,
        cache: PrefixCache | None = None,
    ):  # fmt: skip
        self.allocator, self.page_table, self.page_size = allocator, page_table, page_size
        self.max_running = max_running
        self.cache = cache if cache is not None else RadixCache(page_size)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the last is the newest
        self.num_preemptions = 0
        self.num_prompt_tokens = 0  # tokens of every admitted request (again after a preemption)
        self.num_cached_tokens = 0  # ... of which the prefix cache supplied the KV

    @property
    def hit_rate(self) -> float:
        return self.num_cached_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --8<-- [start:schedule]
    def schedule(self) -> Batch | None:
        return self._schedule_prefill() or self._schedule_decode()

    def _schedule_prefill(self) -> Batch | None:
        admitted: list[Request] = []
        later: list[Request] = []  # requests that wait a step for a prefix this batch computes
        tokens = 0
        while self.waiting and len(self.running) + len(admitted) < self.max_running:
            req = self.waiting.popleft()
            # Match all but the last token: a full hit must still compute one token, whose
            # logits give the first new token.
            pages, handle = self.cache.match(req.tokens(0, req.seq_len - 1))
            cached = len(pages) * self.page_size
            if self._shares_with(admitted, req, cached):
                later.append(req)
                continue
            self.cache.lock(handle)  # before anything is evicted to make room for the rest
            # Keep a page per running request in reserve: admitting a prompt should not force a
            # preemption on the very next decode step.
            reserve = len(self.running) + len(admitted)
            need = -(-req.seq_len // self.page_size) - len(pages)
            too_big = admitted and tokens + req.seq_len - cached > MAX_PREFILL_TOKENS
            if need > self.allocator.num_free + self.cache.evictable_pages - reserve or too_big:
                self.cache.unlock(handle)
                self.waiting.appendleft(req)  # first come, first served: later requests wait behind it
                break
            self._admit(req, pages, handle)
            admitted.append(req)
            tokens += req.num_uncomputed
        self.waiting.extendleft(reversed(later))
        if not admitted:
            return None
        self.running.extend(admitted)
        return self._batch(admitted, is_prefill=True)

    def _admit(self, req: Request, pages: list[int], handle: Handle) -> None:
        req.row = self.page_table.acquire_row()
        if pages:
            self.page_table.write(req.row, 0, pages)
        req.pages, req.num_shared_pages, req.cache_handle = list(pages), len(pages), handle
        req.num_computed = len(pages) * self.page_size  # their K and V are already in the pool
        req.output.cached_tokens = min(req.num_computed, len(req.prompt_ids))
        self.num_prompt_tokens += req.seq_len
        self.num_cached_tokens += req.num_computed
        log.debug("request %d: %d of %d tokens from the prefix cache", req.rid, req.num_computed, req.seq_len)
        grown = self._grow(req, req.seq_len)
        assert grown, "admission checked that the pages exist"
        req.status = Status.RUNNING

    def _shares_with(self, admitted: list[Request], req: Request, cached: int) -> bool:
        """Would `req` compute, beyond what the cache holds, a prefix that `admitted` computes too?"""
        end = cached + MIN_SHARED_TO_WAIT
        if not self.cache.reuses_prefixes or req.seq_len <= end:
            return False
        head = req.tokens(0, end)
        return any(other.seq_len >= end and other.tokens(0, end) == head for other in admitted)

    def _schedule_decode(self) -> Batch | None:
        # Every running request needs a slot for one more token. When the pool runs dry, preempt
        # the newest request (free its pages; it will be recomputed later) until the rest fit.
        for req in list(self.running):
            while req.status is Status.RUNNING and not self._grow(req, req.seq_len):
                self._preempt(self.running[-1])
        return self._batch(self.running, is_prefill=False) if self.running else None

    # --8<-- [end:schedule]

    def _batch(self, reqs: list[Request], is_prefill: bool) -> Batch:
        return Batch(
            requests=list(reqs),
            is_prefill=is_prefill,
            query_lens=[r.num_uncomputed for r in reqs],
            seq_lens=[r.seq_len for r in reqs],
        )

    def _pages_needed(self, req: Request, length: int) -> int:
        return max(0, -(-length // self.page_size) - len(req.pages))

    def _grow(self, req: Request, length: int) -> bool:
        """Give `req` enough pages to hold `length` tokens; False if the pool cannot."""
        need = self._pages_needed(req, length)
        if need == 0:
            return True
        if need > self.allocator.num_free:  # make room by dropping cached prefixes nobody uses
            self.allocator.free(self.cache.evict(need - self.allocator.num_free))
        pages = self.allocator.allocate(need)
        if pages is None:
            return False
        self.page_table.write(req.row, len(req.pages), pages)
        req.pages.extend(pages)
        return True

    def _preempt(self, req: Request) -> None:
        log.warning(
            "KV cache full: preempting request %d (%d tokens); it will be recomputed", req.rid, req.seq_len
        )
        self.num_preemptions += 1
        self.running.remove(req)
        self._release(req)
        req.num_computed = 0  # its KV is gone: prompt and output so far are prefilled again
        req.status = Status.WAITING
        self.waiting.appendleft(req)

    def finish(self, req: Request) -> None:
        self.running.remove(req)
        self.cache_request(req)  # its prompt and output stay for later requests (a chat's next turn)
        self._release(req)
        req.status = Status.FINISHED

    # --8<-- [start:cache_request]
    def cache_request(self, req: Request) -> None:
        """Offer the request's whole computed pages to the prefix cache (after its prefill, and when
        it finishes). Where the cache already holds the same tokens, the request switches to the
        cache's pages and frees its duplicates."""
        count = req.num_computed // self.page_size
        held, handle = self.cache.insert(req.tokens(0, count * self.page_size), req.pages[:count])
        if not held:
            return  # the cache kept nothing: the pages stay the request's own
        self.cache.lock(handle)
        self.cache.unlock(req.cache_handle)
        start = req.num_shared_pages  # pages before it were the cache's already
        mine = req.pages[start : len(held)]
        duplicates = [page for page, kept in zip(mine, held[start:], strict=True) if page != kept]
        if duplicates:
            self.allocator.free(duplicates)
            self.page_table.write(req.row, start, held[start:])
        req.pages[: len(held)] = held
        req.num_shared_pages, req.cache_handle = len(held), handle

    # --8<-- [end:cache_request]

    def _release(self, req: Request) -> None:
        self.allocator.free(req.pages[req.num_shared_pages :])  # the shared pages are the cache's
        self.cache.unlock(req.cache_handle)
        req.pages, req.num_shared_pages, req.cache_handle = [], 0, None
        self.page_table.release_row(req.row)
        req.row = -1

    def check_integrity(self) -> None:
        """Every page is free, held by the prefix cache, or owned by one running request: exactly
        one of these. Raises AssertionError otherwise (tests call it after every step)."""
        free, cached = list(self.allocator.free_pages), self.cache.all_pages()
        owned = [p for r in self.running for p in r.pages[r.num_shared_pages :]]
        every = free + cached + owned
        assert len(every) == len(set(every)) == self.allocator.num_pages, "a page leaked or is held twice"
        self.cache.check_integrity([r.cache_handle for r in self.running])
        for r in self.running:
            tokens, pages = self.cache.prefix(r.cache_handle)
            assert pages == r.pages[: r.num_shared_pages], "a request's shared pages are not the cache's"
            assert tokens == r.tokens(0, len(tokens)), "a request uses the KV of other tokens"
            assert r.num_computed <= len(r.pages) * self.page_size
        for r in self.waiting:
            assert not r.pages and r.cache_handle is None, "a waiting request holds pages"
