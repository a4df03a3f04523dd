"""Continuous batching with chunked prefill: which tokens run in the next step.

A step computes at most `max_prefill_length` prompt tokens. A prompt longer than what is left of
that budget is cut: its first chunk runs now, the rest in later steps, its KV growing chunk by
chunk. Several short prompts share one step's budget. The policy decides how prefill chunks and
running decodes meet:

- `mixed` (default, Sarathi-Serve's idea): every step carries one token for every decoding request
  plus prefill chunks up to the budget, so decodes never stall behind a long prompt;
- `prefill-first` (stage 03's order): steps with prefill work carry only prefill; decodes wait.

With a prefix cache, admission first looks the request up in the cache: the matched pages become
the start of its page table and only the rest of the prompt is prefilled. A request hands its
whole pages to the cache once its prompt is prefilled (never while it is still being chunked) and
again when it finishes.
"""

from __future__ import annotations

import logging
from collections import deque

from .kv_cache import PageAllocator
from .page_table import PageTable
from .radix_cache import Handle, PrefixCache, RadixCache
from .request import Batch, Request, Status

log = logging.getLogger(__name__)

# Mini-SGLang's default budget: large enough to keep the GPU busy, small enough to bound the
# activation memory of a step and the stall a long prompt causes.
DEFAULT_MAX_PREFILL_LENGTH = 8192
POLICIES = ("mixed", "prefill-first")
# A waiting request that shares at least this many uncached tokens with a request admitted in the
# same batch waits one step: once that request is prefilled, the shared tokens come from the cache
# instead of being computed twice. Short shared heads (a chat template's first tokens) are not
# worth the wait.
MIN_SHARED_TO_WAIT = 32


class Scheduler:
    def __init__(
        self, allocator: PageAllocator, page_table: PageTable, page_size: int, max_running: int,
        cache: PrefixCache | None = None, max_prefill_length: int = DEFAULT_MAX_PREFILL_LENGTH,
        policy: str = "mixed",
    ):  # fmt: skip
        self.allocator, self.page_table, self.page_size = allocator, page_table, page_size
        self.max_running = max_running
        self.max_prefill_length, self.policy = max_prefill_length, policy
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
    # --8<-- [start:policy]
    def schedule(self) -> Batch | None:
        if self.policy == "mixed":
            decodes = self._decodes()  # first: they may preempt, and must not wait for prefill
            chunks = self._prefill_chunks(self.max_prefill_length)
        else:  # prefill-first: a step with prefill work carries nothing else
            chunks = self._prefill_chunks(self.max_prefill_length)
            decodes = [] if chunks else self._decodes()
        work = [(r, 1) for r in decodes] + chunks
        if not work and self.running:
            # Prompts under way hold the pool and none can grow: recompute the newest later so
            # the others can finish (a lone request always fits; add_request checks that).
            self._preempt(self.running[-1])
            return self.schedule()
        return self._batch(work) if work else None

    # --8<-- [end:policy]

    # --8<-- [start:decodes]
    def _decodes(self) -> list[Request]:
        """Running requests past their prompt: one token each. When the pool runs dry, preempt the
        newest request (free its pages; it will be recomputed later) until the rest fit."""
        for req in [r for r in self.running if self._is_decoding(r)]:
            while req.status is Status.RUNNING and not self._grow(req, req.seq_len):
                self._preempt(self.running[-1])
        return [r for r in self.running if self._is_decoding(r)]

    @staticmethod
    def _is_decoding(req: Request) -> bool:
        return bool(req.output_ids) and req.num_uncomputed == 1

    # --8<-- [end:decodes]

    # --8<-- [start:chunks]
    def _prefill_chunks(self, budget: int) -> list[tuple[Request, int]]:
        """(request, tokens to compute) pairs within the budget: first the requests whose prefill
        is under way (oldest first), then new admissions; the last one may be cut."""
        chunks: list[tuple[Request, int]] = []
        for req in self.running:
            if budget == 0:
                return chunks
            if self._is_decoding(req):
                continue
            size = min(req.num_uncomputed, budget)
            if not self._grow(req, req.num_computed + size):
                return chunks  # no pages for now: finishing decodes will free some
            chunks.append((req, size))
            budget -= size
        later: list[Request] = []  # requests that wait a step for a prefix this batch computes
        admitted = [r for r, _ in chunks]
        while budget > 0 and self.waiting and len(self.running) < self.max_running:
            req = self.waiting.popleft()
            # Match all but the last token: a full hit must still compute one token, whose
            # logits give the first new token.
            pages, handle = self.cache.match(req.tokens(0, req.seq_len - 1))
            cached = len(pages) * self.page_size
            if self._shares_with(admitted, req, cached):
                later.append(req)
                continue
            self.cache.lock(handle)  # before anything is evicted to make room for the rest
            size = min(req.seq_len - cached, budget)
            # Keep a page per running request in reserve: admitting a prompt should not force a
            # preemption on the very next decode step.
            need = -(-(cached + size) // self.page_size) - len(pages)
            if need > self.allocator.num_free + self.cache.evictable_pages - len(self.running):
                self.cache.unlock(handle)
                self.waiting.appendleft(req)  # first come, first served: later requests wait behind it
                break
            self._admit(req, pages, handle, cached + size)
            self.running.append(req)
            admitted.append(req)
            chunks.append((req, size))
            budget -= size
        self.waiting.extendleft(reversed(later))
        return chunks

    # --8<-- [end:chunks]

    def _admit(self, req: Request, pages: list[int], handle: Handle, length: int) -> None:
        """Give the request a page-table row starting with the cached pages, and room for `length`."""
        req.row = self.page_table.acquire_row()
        if pages:
            self.page_table.write(req.row, 0, pages)
        req.pages, req.num_shared_pages, req.cache_handle = list(pages), len(pages), handle
        req.num_computed = len(pages) * self.page_size  # their K and V are already in the pool
        req.output.cached_tokens = min(req.num_computed, len(req.prompt_ids))
        self.num_prompt_tokens += req.seq_len
        self.num_cached_tokens += req.num_computed
        log.debug("request %d: %d of %d tokens from the prefix cache", req.rid, req.num_computed, req.seq_len)
        grown = self._grow(req, length)
        assert grown, "admission checked that the pages exist"
        req.status = Status.RUNNING

    def _shares_with(self, admitted: list[Request], req: Request, cached: int) -> bool:
        """Would `req` compute, beyond what the cache holds, a prefix that `admitted` computes too?"""
        end = cached + MIN_SHARED_TO_WAIT
        if not self.cache.reuses_prefixes or req.seq_len <= end:
            return False
        head = req.tokens(0, end)
        return any(other.seq_len >= end and other.tokens(0, end) == head for other in admitted)

    # --8<-- [end:schedule]

    # --8<-- [start:batch]
    def _batch(self, work: list[tuple[Request, int]]) -> Batch:
        computed = [r.num_computed + n for r, n in work]
        return Batch(
            requests=[r for r, _ in work],
            # Decode kernels serve a step only when every request computes a single token.
            is_prefill=any(n > 1 for _, n in work),
            query_lens=[n for _, n in work],
            seq_lens=computed,
            # A request is sampled when this step reaches the end of its tokens; a cut prompt is not.
            sampled=[c == r.seq_len for (r, _), c in zip(work, computed, strict=True)],
        )

    # --8<-- [end:batch]

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
