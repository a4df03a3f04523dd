"""Continuous batching: which requests run in the next step.

Each step is either a prefill batch (newly admitted requests) or a decode batch (one token for
every running request). Prefill goes first, so new requests join the running set as soon as there
is room; finished requests leave after every step and give their pages back at once. When the
pool runs dry during decode, the newest request is preempted: its pages are released and it is
recomputed later, so no request ever needs its whole max_tokens reserved up front.

Where the next features slot in:
- prefix cache: admission already asks `kv.match` for a cached prefix and computes only the rest;
- chunked prefill: `max_prefill_tokens` is the per-step token budget; a request that does not fit
  it is cut to the remaining budget instead of waiting (see `_prefill_len`).
"""

from __future__ import annotations

import logging
from collections import deque

from ..core.errors import UserError
from ..kvcache import KVCacheManager, PageTable
from .request import Request, ScheduledBatch, Status

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        page_table: PageTable,
        page_size: int,
        max_running: int,
        max_prefill_tokens: int,
    ):
        self.kv, self.page_table, self.page_size = kv, page_table, page_size
        self.max_running, self.max_prefill_tokens = max_running, max_prefill_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the last is the newest
        self.by_rid: dict[int, Request] = {}
        self.num_preemptions = 0

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

    def schedule(self) -> ScheduledBatch | None:
        return self._schedule_prefill() or self._schedule_decode()

    def _prefill_len(self, req: Request, budget_left: int, first: bool) -> int:
        """How many of the request's uncomputed tokens this step computes; 0: it waits.
        Whole prompts only for now (a prompt longer than the budget still runs, alone);
        chunked prefill will return min(num_uncomputed, budget_left) here."""
        if first or req.num_uncomputed <= budget_left:
            return req.num_uncomputed
        return 0

    def _schedule_prefill(self) -> ScheduledBatch | None:
        admitted: list[Request] = []
        query_lens: list[int] = []
        budget_left = self.max_prefill_tokens
        while self.waiting and len(self.running) + len(admitted) < self.max_running:
            req = self.waiting[0]
            if req.num_computed == 0 and req.row < 0:
                req.prefix = self.kv.match(req.all_ids())
                req.num_computed = req.prefix.num_tokens
            # Keep a page per running request in reserve: admitting a prompt should not force a
            # preemption on the very next decode step.
            reserve = len(self.running) + len(admitted)
            need = self._pages_needed(req, req.seq_len)
            q_len = self._prefill_len(req, budget_left, first=not admitted)
            if q_len == 0 or need > self.kv.num_available_pages - reserve:
                self._drop_prefix(req)
                break  # first come, first served: later requests wait behind this one
            self.waiting.popleft()
            req.row = self.page_table.acquire_row()
            self.page_table.write(req.row, 0, req.prefix.pages)
            req.pages = list(req.prefix.pages)
            grown = self._grow(req, req.seq_len)
            assert grown, "admission checked the pages were available"
            if req.status is Status.WAITING and not req.output_ids:
                req.cached_tokens = req.prefix.num_tokens
            req.status = Status.RUNNING
            admitted.append(req)
            query_lens.append(q_len)
            budget_left -= q_len
        if not admitted:
            return None
        self.running.extend(admitted)
        return ScheduledBatch(admitted, is_prefill=True, query_lens=query_lens)

    def _schedule_decode(self) -> ScheduledBatch | None:
        # Every running request needs a slot for one more token. When the pool runs dry, preempt
        # the newest request (release its pages; it is recomputed later) until the rest fit.
        for req in list(self.running):
            while req.status is Status.RUNNING and not self._grow(req, req.seq_len):
                self._preempt(self.running[-1])
        if not self.running:
            return None
        return ScheduledBatch(list(self.running), is_prefill=False, query_lens=[1] * len(self.running))

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
        self.kv.release(req.tokens(0, req.num_computed), req.pages, req.prefix)
        self.page_table.release_row(req.row)
        req.pages, req.row, req.prefix = [], -1, type(req.prefix)()

    def _drop_prefix(self, req: Request) -> None:
        """A request that matched a prefix but could not be admitted gives the match back."""
        if req.row < 0 and req.prefix.num_tokens:
            self.kv.prefix_cache.unlock(req.prefix)
            req.prefix = type(req.prefix)()
            req.num_computed = 0

    def pages_in_use(self) -> int:
        """Pages held by live requests beyond what they borrowed from the prefix cache."""
        return sum(len(r.pages) - len(r.prefix.pages) for r in self.running)
