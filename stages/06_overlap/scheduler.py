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

With overlap scheduling (engine.py) the next step is scheduled while the previous one is still
on the GPU: a request's last sampled token may be pending (`Request.num_pending`). Then nothing
the step in flight may use is given back: a preemption waits for it (`NeedsDrain`), and the pages,
row and cache locks of a request that finishes or is aborted wait in `retiring` until the engine
calls `release_retired` once that step is complete.
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


class NeedsDrain(Exception):
    """The pool ran dry while a step is in flight: a preemption must wait until that step is
    complete, since the victim's pages, row and pending token belong to it."""


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
        # Finished or aborted while a step was in flight (which may still use their pages, rows and
        # cached prefixes): `release_retired` gives those back once that step is complete.
        self.retiring: list[Request] = []
        self.retired_pages: list[int] = []  # duplicates dropped by cache_request meanwhile
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
    def schedule(self, can_preempt: bool = True) -> Batch | None:
        """The next step, or None. With a step in flight (`can_preempt` False) a preemption raises
        NeedsDrain instead: the caller completes that step and asks again."""
        self.can_preempt = can_preempt
        if self.policy == "mixed":
            decodes = self._decodes()  # first: they may preempt, and must not wait for prefill
            chunks = self._prefill_chunks(self.max_prefill_length)
        else:  # prefill-first: a step with prefill work carries nothing else
            chunks = self._prefill_chunks(self.max_prefill_length)
            decodes = [] if chunks else self._decodes()
        work = [(r, 1) for r in decodes] + chunks
        if not work and any(not r.out_of_tokens for r in self.running):
            # Prompts under way hold the pool and none can grow: recompute the newest later so
            # the others can finish (a lone request always fits; add_request checks that).
            self._preempt(self.running[-1])
            return self.schedule(can_preempt)
        return self._batch(work) if work else None

    # --8<-- [end:policy]

    # --8<-- [start:decodes]
    def _decodes(self) -> list[Request]:
        """Running requests past their prompt: one token each. When the pool runs dry, preempt the
        newest request (free its pages; it will be recomputed later) until the rest fit. A request
        whose last allowed token is in flight is left out: it finishes when that token arrives."""
        for req in [r for r in self.running if r.is_decoding and not r.out_of_tokens]:
            while req.status is Status.RUNNING and not self._grow(req, req.seq_len):
                self._preempt(self.running[-1])
        return [r for r in self.running if r.is_decoding and not r.out_of_tokens]

    # --8<-- [end:decodes]

    # --8<-- [start:chunks]
    def _prefill_chunks(self, budget: int) -> list[tuple[Request, int]]:
        """(request, tokens to compute) pairs within the budget: first the requests whose prefill
        is under way (oldest first), then new admissions; the last one may be cut."""
        chunks: list[tuple[Request, int]] = []
        for req in self.running:
            if budget == 0:
                return chunks
            if req.is_decoding:
                continue
            size = min(req.num_uncomputed, budget)
            if not self._grow(req, req.num_computed + size):
                return chunks  # no pages for now: finishing decodes will free some
            chunks.append((req, size))
            budget -= size
        later: list[Request] = []  # requests that wait a step for a prefix this batch computes
        admitted = [r for r, _ in chunks]
        # A retiring request still holds its page-table row until the step in flight is done.
        while budget > 0 and self.waiting and len(self.running) + len(self.retiring) < self.max_running:
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
        if not self.can_preempt:
            raise NeedsDrain
        log.warning(
            "KV cache full: preempting request %d (%d tokens); it will be recomputed", req.rid, req.seq_len
        )
        self.num_preemptions += 1
        self.running.remove(req)
        self._release(req)
        req.num_computed = 0  # its KV is gone: prompt and output so far are prefilled again
        req.status = Status.WAITING
        self.waiting.appendleft(req)

    # --8<-- [start:retire]
    def finish(self, req: Request, defer_release: bool = False) -> None:
        """The request leaves the batch now. Its pages, row and cache lock go back now, or, with
        `defer_release` (a step in flight may still use them), at `release_retired`."""
        self.running.remove(req)
        # Its prompt and output stay for later requests (a chat's next turn).
        self.cache_request(req, defer_release)
        req.status = Status.FINISHED
        if defer_release:
            self.retiring.append(req)
        else:
            self._release(req)

    def abort(self, rid: int, defer_release: bool = False) -> bool:
        """Drop a request wherever it is (see `finish`). False when it is not here: finished
        already (perhaps still retiring) or unknown. So an abort racing a finish frees nothing twice."""
        req = next((r for r in [*self.waiting, *self.running] if r.rid == rid), None)
        if req is None:
            return False
        if req.status is Status.RUNNING:
            self.finish(req, defer_release)
        else:  # waiting: it holds nothing
            self.waiting.remove(req)
            req.status = Status.FINISHED
        return True

    def release_retired(self) -> None:
        """The step in flight is complete: what the requests that left meanwhile held goes back."""
        for req in self.retiring:
            self._release(req)
        self.allocator.free(self.retired_pages)
        self.retiring, self.retired_pages = [], []

    # --8<-- [end:retire]

    # --8<-- [start:cache_request]
    def cache_request(self, req: Request, defer_release: bool = False) -> None:
        """Offer the request's whole computed pages to the prefix cache (after its prefill, and when
        it finishes). Where the cache already holds the same tokens, the request switches to the
        cache's pages and frees its duplicates (after the step in flight, with `defer_release`)."""
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
            if defer_release:
                self.retired_pages.extend(duplicates)
            else:
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
        """Every page is free, held by the prefix cache, or owned by one running or retiring
        request (or retired, waiting for the step in flight): exactly one of these. Raises
        AssertionError otherwise (tests call it after every step)."""
        holders = self.running + self.retiring
        free, cached = list(self.allocator.free_pages), self.cache.all_pages()
        owned = [p for r in holders for p in r.pages[r.num_shared_pages :]] + self.retired_pages
        every = free + cached + owned
        assert len(every) == len(set(every)) == self.allocator.num_pages, "a page leaked or is held twice"
        self.cache.check_integrity([r.cache_handle for r in holders])
        assert all(r.status is Status.FINISHED for r in self.retiring), "a retiring request runs"
        for r in self.running:
            tokens, pages = self.cache.prefix(r.cache_handle)
            assert pages == r.pages[: r.num_shared_pages], "a request's shared pages are not the cache's"
            assert tokens == r.tokens(0, len(tokens)), "a request uses the KV of other tokens"
            assert r.num_computed <= len(r.pages) * self.page_size
        for r in self.waiting:
            assert not r.pages and r.cache_handle is None, "a waiting request holds pages"
            assert r.num_pending == 0, "a waiting request has a token in flight"
