"""Continuous batching: which requests run in the next step.

Each step is either a prefill batch (newly admitted requests, whole prompts) or a decode batch
(one token for every running request). Prefill goes first, so new requests join the running set
as soon as there is room; finished requests leave after every step and free their pages at once.
"""

from __future__ import annotations

import logging
from collections import deque

from .kv_cache import PageAllocator
from .page_table import PageTable
from .request import Batch, Request, Status

log = logging.getLogger(__name__)

# Stage 02 prefills whole prompts; this caps the tokens of one prefill batch (activation memory
# grows with it). A single longer prompt still runs alone. Stage 04 makes this a real budget.
MAX_PREFILL_TOKENS = 16384


class Scheduler:
    def __init__(self, allocator: PageAllocator, page_table: PageTable, page_size: int, max_running: int):
        self.allocator, self.page_table, self.page_size = allocator, page_table, page_size
        self.max_running = max_running
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the last is the newest
        self.num_preemptions = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --8<-- [start:schedule]
    def schedule(self) -> Batch | None:
        return self._schedule_prefill() or self._schedule_decode()

    def _schedule_prefill(self) -> Batch | None:
        admitted: list[Request] = []
        tokens = 0
        while self.waiting and len(self.running) + len(admitted) < self.max_running:
            req = self.waiting[0]
            # Keep a page per running request in reserve: admitting a prompt should not force a
            # preemption on the very next decode step.
            reserve = len(self.running) + len(admitted)
            if self._pages_needed(req, req.seq_len) > self.allocator.num_free - reserve:
                break  # first come, first served: later requests wait behind this one
            if admitted and tokens + req.num_uncomputed > MAX_PREFILL_TOKENS:
                break
            self.waiting.popleft()
            req.row = self.page_table.acquire_row()
            self._grow(req, req.seq_len)
            req.status = Status.RUNNING
            admitted.append(req)
            tokens += req.num_uncomputed
        if not admitted:
            return None
        self.running.extend(admitted)
        return self._batch(admitted, is_prefill=True)

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
        pages = self.allocator.allocate(need)
        if pages is None:
            return False
        self.page_table.write(req.row, len(req.pages), pages)
        req.pages.extend(pages)
        return True

    # --8<-- [start:preempt]
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

    # --8<-- [end:preempt]

    def finish(self, req: Request) -> None:
        self.running.remove(req)
        self._release(req)
        req.status = Status.FINISHED

    def _release(self, req: Request) -> None:
        self.allocator.free(req.pages)
        req.pages = []
        self.page_table.release_row(req.row)
        req.row = -1
