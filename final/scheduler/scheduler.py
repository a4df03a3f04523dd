"""Continuous batching with a prefix cache and chunked prefill: which tokens run in the next step.

A step computes at most `max_prefill_length` prompt tokens. A prompt longer than what is left of
that budget is cut: its first chunk runs now, the rest in later steps, its KV growing chunk by
chunk; a cut prompt samples nothing. Several short prompts share one step's budget. The policy
(policy.py: `mixed`, `prefill-first`) decides how prefill chunks and running decodes meet.

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

from ..core.errors import UserError
from ..kvcache.manager import KVCacheManager
from .policy import Chunks, MixedPolicy, SchedulingPolicy
from .request import Request, ScheduledBatch, Status

log = logging.getLogger(__name__)

# A waiting request that shares at least this many uncached tokens with a request admitted in the
# same step waits one step: once that request is prefilled, the shared tokens come from the cache
# instead of being computed twice. Short shared heads (a chat template's first tokens) are not
# worth the wait.
MIN_SHARED_TO_WAIT = 32


class NeedsDrain(Exception):
    """The pool ran dry while a step is in flight: a preemption must wait until it is collected
    (the preempted request's pages and its last token are still the step's)."""


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        max_running: int,
        max_prefill_length: int,
        policy: SchedulingPolicy | None = None,  # None: mixed
    ):
        self.kv = kv
        self.max_running, self.max_prefill_length = max_running, max_prefill_length
        self.policy = policy or MixedPolicy()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the last is the newest
        # Finished or aborted requests whose pages wait for the step in flight (overlap scheduling:
        # it may still read them); `release_retired` frees them once that step is complete.
        self.retiring: list[Request] = []
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

    def add(self, req: Request) -> None:
        if req.rid in self.by_rid:
            raise UserError(f"request id {req.rid} is already in the engine")
        self.by_rid[req.rid] = req
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, can_preempt: bool = True) -> ScheduledBatch | None:
        """The next step's requests and token counts; None when nothing can run. With a step in
        flight (`can_preempt` False) a preemption cannot happen now: NeedsDrain is raised instead,
        and the caller collects the step in flight before asking again."""
        decodes, chunks = self.policy.select(self, can_preempt)
        while not decodes and not chunks and any(not r.out_of_tokens for r in self.running):
            # Prompts under way hold the pool and none can grow: recompute the newest later so
            # the others can finish (a lone request always fits; add_request checks that).
            self._preempt(self.running[-1], can_preempt)
            decodes, chunks = self.policy.select(self, can_preempt)
        if not decodes and not chunks:
            return None
        return ScheduledBatch(
            requests=decodes + [r for r, _ in chunks],
            query_lens=[1] * len(decodes) + [n for _, n in chunks],
            # A request is sampled when the step reaches the end of its tokens: a decode always
            # does (its one uncomputed token), a prompt chunk when it is the prompt's last.
            sampled=[True] * len(decodes) + [r.num_computed + n == r.seq_len for r, n in chunks],
        )

    def decodes(self, can_preempt: bool) -> list[Request]:
        """Running requests past their prompt: one token each. When the pool runs dry, preempt the
        newest request until the rest fit."""
        # A request whose last token is already in flight and used up max_tokens is done: it
        # finishes when that token is collected, and another step for it would be wasted.
        decodes = [r for r in self.running if r.is_decoding and not r.out_of_tokens]
        preemptions = self.num_preemptions
        for req in decodes:
            while req.status is Status.RUNNING and not self.kv.grow(req.kv, req.seq_len):
                self._preempt(self.running[-1], can_preempt)
        if self.num_preemptions == preemptions:
            return decodes
        # Preempted requests left the batch: the survivors, in the running list's order.
        return [r for r in self.running if r.is_decoding and not r.out_of_tokens]

    def prefill_chunks(self, budget: int) -> Chunks:
        """(request, tokens to compute) pairs within the budget: first the requests whose prefill
        is under way (oldest first), then new admissions; the last one may be cut."""
        chunks: Chunks = []
        for req in self.running:
            if budget == 0:
                return chunks
            if req.is_decoding:
                continue
            size = min(req.num_uncomputed, budget)
            if not self.kv.grow(req.kv, req.num_computed + size):
                return chunks  # no pages for now: finishing decodes will free some
            chunks.append((req, size))
            budget -= size
        later: list[Request] = []  # requests that wait a step for a prefix this step computes
        admitted = [r for r, _ in chunks]
        while budget > 0 and self.waiting and len(self.running) < self.max_running:
            req = self.waiting[0]  # off the queue once admitted: an error on the way loses nothing
            match = self.kv.match(req.all_ids())
            if self._shares_with(admitted, req, match.num_tokens):
                later.append(self.waiting.popleft())
                continue
            size = min(req.seq_len - match.num_tokens, budget)
            # Keep a page per running request in reserve: admitting a prompt should not force a
            # preemption on the very next decode step.
            if not self.kv.admit(req.kv, match, match.num_tokens + size, reserve=len(self.running)):
                break  # first come, first served: later requests wait behind it
            self.waiting.popleft()
            self._start(req, match.num_tokens)
            admitted.append(req)
            chunks.append((req, size))
            budget -= size
        self.waiting.extendleft(reversed(later))
        return chunks

    def _start(self, req: Request, num_cached: int) -> None:
        """An admitted request runs: the matched prefix's K and V are in the pool already."""
        req.num_computed = num_cached
        if not req.output_ids:  # after a preemption mid-answer, keep what the first admission said
            req.cached_tokens = min(num_cached, len(req.prompt_ids))
        self.num_prompt_tokens += req.seq_len
        self.num_cached_tokens += num_cached
        req.status = Status.RUNNING
        self.running.append(req)

    def _shares_with(self, admitted: list[Request], req: Request, cached: int) -> bool:
        """Would `req` compute, beyond what the cache holds, a prefix that `admitted` computes too?"""
        end = cached + MIN_SHARED_TO_WAIT
        if not self.kv.prefix_cache.reuses_prefixes or req.seq_len <= end:
            return False
        head = req.tokens(0, end)
        return any(other.seq_len >= end and other.tokens(0, end) == head for other in admitted)

    def cache_request(self, req: Request) -> None:
        """Offer the request's computed tokens to the prefix cache: once its whole prompt is
        prefilled (never a prompt cut mid-way), and when it finishes."""
        if req.num_computed < len(req.prompt_ids):
            return
        # Only tokens the host knows go in (a token still in flight is not computed yet anyway).
        computed = min(req.num_computed, len(req.prompt_ids) + len(req.output_ids))
        self.kv.cache(req.kv, req.tokens(0, computed), computed)

    def _preempt(self, req: Request, can_preempt: bool) -> None:
        if not can_preempt:
            raise NeedsDrain
        log.warning(
            "KV cache full: preempting request %d (%d tokens); it will be recomputed", req.rid, req.seq_len
        )
        self.num_preemptions += 1
        self.running.remove(req)
        self.kv.release(req.kv)
        req.num_computed = 0  # its KV is gone: prompt and output so far are prefilled again
        req.last_token_on_device = False  # its row goes too
        req.status = Status.WAITING
        self.waiting.appendleft(req)

    def finish(self, req: Request, defer_release: bool = False) -> None:
        """A running request is done: it leaves the batch at once; its pages go back now, or, with
        `defer_release` (a step in flight may still read them), at `release_retired`."""
        self.running.remove(req)
        self.cache_request(req)  # its prompt and output stay for later requests (a chat's next turn)
        req.status = Status.FINISHED
        del self.by_rid[req.rid]
        if defer_release:
            self.retiring.append(req)
        else:
            self.kv.release(req.kv)

    def abort(self, rid: int, defer_release: bool = False) -> bool:
        """Drop a request wherever it is and give its pages back (see `finish`); False if it is not
        here (finished already, or never added): an abort racing a finish is a no-op."""
        req = self.by_rid.get(rid)
        if req is None:
            return False
        if req.status is Status.RUNNING:
            self.finish(req, defer_release)
        else:
            self.waiting.remove(req)
            req.status = Status.FINISHED
            del self.by_rid[rid]
        return True

    def release_retired(self) -> None:
        """The step in flight is complete: free the pages of the requests that finished meanwhile."""
        for req in self.retiring:
            self.kv.release(req.kv)
        self.retiring.clear()

    def check_integrity(self) -> None:
        """The KV manager's invariants over the running requests, and per request: its shared pages
        hold its own tokens, its computed tokens fit its pages; waiting requests hold nothing."""
        self.kv.check_integrity(r.kv for r in self.running + self.retiring)
        for r in self.running:
            tokens, _ = self.kv.prefix_cache.prefix(r.kv.handle)
            assert tokens == r.tokens(0, len(tokens)), "a request uses the KV of other tokens"
            assert r.num_computed <= len(r.kv.pages) * self.kv.page_size
        for r in self.waiting:
            assert not r.kv.holds_pages and not r.kv.pages and r.kv.handle is None, (
                "a waiting request holds pages"
            )
            assert r.num_pending == 0, "a waiting request has a token in flight"
        for r in self.retiring:
            assert r.status is Status.FINISHED and r.rid not in self.by_rid
