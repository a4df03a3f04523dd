"""Continuous batching with a prefix cache and chunked prefill: which tokens run in the next step.

A step computes at most `max_prefill_length` prompt tokens. A prompt longer than what is left of
that budget is cut: its first chunk runs now, the rest in later steps, its KV growing chunk by
chunk; a cut prompt samples nothing. Several short prompts share one step's budget. The policy
decides how prefill chunks and running decodes meet (stage 04):

- `mixed` (default, Sarathi-Serve's idea): every step carries one token for every decoding request
  plus prefill chunks up to the budget, so decodes never stall behind a long prompt;
- `prefill-first`: steps with prefill work carry only prefill; decodes wait.

Admission first looks the request up in the prefix cache (stage 03): the matched pages start its
page table, locked while it runs, and only the rest of the prompt is computed. A request hands its
whole pages to the cache once its whole prompt is prefilled (never while it is being chunked) and
again when it finishes or is aborted. When the pool runs dry, unlocked cached prefixes are evicted
first; then the newest request is preempted: it unlocks its prefix, frees its own pages and is
recomputed later, so no request needs its whole max_tokens reserved up front.
"""

from __future__ import annotations

import logging
from collections import deque

from ..core.config import CHUNK_POLICIES
from ..core.errors import UserError
from ..kvcache import KVCacheManager, PageTable, PrefixMatch
from .request import Request, ScheduledBatch, Status

log = logging.getLogger(__name__)

# A waiting request that shares at least this many uncached tokens with a request admitted in the
# same step waits one step: once that request is prefilled, the shared tokens come from the cache
# instead of being computed twice. Short shared heads (a chat template's first tokens) are not
# worth the wait.
MIN_SHARED_TO_WAIT = 32


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        page_table: PageTable,
        page_size: int,
        max_running: int,
        max_prefill_tokens: int,
        policy: str = "mixed",
    ):
        if policy not in CHUNK_POLICIES:
            raise UserError(f"unknown chunk policy {policy!r}; choose from {', '.join(CHUNK_POLICIES)}")
        self.kv, self.page_table, self.page_size = kv, page_table, page_size
        self.cache = kv.prefix_cache
        self.max_running, self.max_prefill_tokens, self.policy = max_running, max_prefill_tokens, policy
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the last is the newest
        self.by_rid: dict[int, Request] = {}
        self.num_preemptions = 0
        self.num_prompt_tokens = 0  # tokens of every admission (again after a preemption)
        self.num_cached_tokens = 0  # ... of which the prefix cache supplied the KV

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def hit_rate(self) -> float:
        return self.num_cached_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0

    def add(self, req: Request) -> None:
        if req.rid in self.by_rid:
            raise UserError(f"request id {req.rid} is already in the engine")
        self.by_rid[req.rid] = req
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch | None:
        if self.policy == "mixed":
            decodes = self._decodes()  # first: they may preempt, and must not wait for prefill
            chunks = self._prefill_chunks(self.max_prefill_tokens)
        else:  # prefill-first: a step with prefill work carries nothing else
            chunks = self._prefill_chunks(self.max_prefill_tokens)
            decodes = [] if chunks else self._decodes()
        work = [(r, 1) for r in decodes] + chunks
        if not work and self.running:
            # Prompts under way hold the pool and none can grow: recompute the newest later so
            # the others can finish (a lone request always fits; add_request checks that).
            self._preempt(self.running[-1])
            return self.schedule()
        if not work:
            return None
        computed = [r.num_computed + n for r, n in work]
        return ScheduledBatch(
            requests=[r for r, _ in work],
            query_lens=[n for _, n in work],
            # A request is sampled when the step reaches the end of its tokens; a cut prompt is not.
            sampled=[c == r.seq_len for (r, _), c in zip(work, computed, strict=True)],
        )

    def _decodes(self) -> list[Request]:
        """Running requests past their prompt: one token each. When the pool runs dry, preempt the
        newest request until the rest fit."""
        for req in [r for r in self.running if r.is_decoding]:
            while req.status is Status.RUNNING and not self._grow(req, req.seq_len):
                self._preempt(self.running[-1])
        return [r for r in self.running if r.is_decoding]

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
        later: list[Request] = []  # requests that wait a step for a prefix this step computes
        admitted = [r for r, _ in chunks]
        while budget > 0 and self.waiting and len(self.running) < self.max_running:
            req = self.waiting.popleft()
            match = self.kv.match(req.all_ids())
            if self._shares_with(admitted, req, match.num_tokens):
                later.append(req)
                continue
            self.cache.lock(match.handle)  # before anything is evicted to make room for the rest
            size = min(req.seq_len - match.num_tokens, budget)
            # Keep a page per running request in reserve: admitting a prompt should not force a
            # preemption on the very next decode step.
            need = -(-(match.num_tokens + size) // self.page_size) - len(match.pages)
            if need > self.kv.num_available_pages - len(self.running):
                self.cache.unlock(match.handle)
                self.waiting.appendleft(req)  # first come, first served: later requests wait behind it
                break
            self._admit(req, match, match.num_tokens + size)
            admitted.append(req)
            chunks.append((req, size))
            budget -= size
        self.waiting.extendleft(reversed(later))
        return chunks

    def _admit(self, req: Request, match: PrefixMatch, length: int) -> None:
        """Give the request a page-table row starting with the cached pages, and room for `length`."""
        req.row = self.page_table.acquire_row()
        self.page_table.write(req.row, 0, match.pages)
        req.pages, req.num_shared_pages, req.cache_handle = list(match.pages), len(match.pages), match.handle
        req.num_computed = match.num_tokens  # their K and V are in the pool already
        if not req.output_ids:  # after a preemption mid-answer, keep what the first admission said
            req.cached_tokens = min(match.num_tokens, len(req.prompt_ids))
        self.num_prompt_tokens += req.seq_len
        self.num_cached_tokens += match.num_tokens
        grown = self._grow(req, length)
        assert grown, "admission checked that the pages exist"
        req.status = Status.RUNNING
        self.running.append(req)

    def _shares_with(self, admitted: list[Request], req: Request, cached: int) -> bool:
        """Would `req` compute, beyond what the cache holds, a prefix that `admitted` computes too?"""
        end = cached + MIN_SHARED_TO_WAIT
        if not self.cache.reuses_prefixes or req.seq_len <= end:
            return False
        head = req.tokens(0, end)
        return any(other.seq_len >= end and other.tokens(0, end) == head for other in admitted)

    def _pages_needed(self, req: Request, length: int) -> int:
        return max(0, -(-length // self.page_size) - len(req.pages))

    def _grow(self, req: Request, length: int) -> bool:
        """Give `req` enough pages to hold `length` tokens; False if the pool cannot."""
        need = self._pages_needed(req, length)
        if need == 0:
            return True
        pages = self.kv.allocate(need)
        if pages is None:
            return False
        self.page_table.write(req.row, len(req.pages), pages)
        req.pages.extend(pages)
        return True

    def cache_request(self, req: Request) -> None:
        """Offer the request's whole computed pages to the prefix cache (once its whole prompt is
        prefilled, and when it finishes). Where the cache already holds the same tokens, the
        request switches to the cache's pages and frees its duplicates."""
        if req.num_computed < len(req.prompt_ids):
            return  # a prompt cut mid-way enters the cache only once all of it is in
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
            self.kv.free(duplicates)
            self.page_table.write(req.row, start, held[start:])
        req.pages[: len(held)] = held
        req.num_shared_pages, req.cache_handle = len(held), handle

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
        del self.by_rid[req.rid]

    def abort(self, rid: int) -> bool:
        """Drop a request wherever it is and give its pages back; False if it is not here."""
        req = self.by_rid.get(rid)
        if req is None:
            return False
        if req.status is Status.RUNNING:
            self.finish(req)
        else:
            self.waiting.remove(req)
            req.status = Status.FINISHED
            del self.by_rid[rid]
        return True

    def _release(self, req: Request) -> None:
        """Free the request's own pages and unlock the cache's; the cache keeps those."""
        self.kv.free(req.own_pages)
        self.cache.unlock(req.cache_handle)
        req.pages, req.num_shared_pages, req.cache_handle = [], 0, None
        self.page_table.release_row(req.row)
        req.row = -1

    def check_integrity(self) -> None:
        """Every page is free, held by the prefix cache, or owned by one running request: exactly
        one of these; the cache's locks are exactly the running requests'. AssertionError if not."""
        self.kv.check_integrity(
            [p for r in self.running for p in r.own_pages], [r.cache_handle for r in self.running]
        )
        for r in self.running:
            tokens, pages = self.cache.prefix(r.cache_handle)
            assert pages == r.pages[: r.num_shared_pages], "a request's shared pages are not the cache's"
            assert tokens == r.tokens(0, len(tokens)), "a request uses the KV of other tokens"
            assert r.num_computed <= len(r.pages) * self.page_size
        for r in self.waiting:
            assert not r.pages and r.cache_handle is None and r.row < 0, "a waiting request holds pages"
