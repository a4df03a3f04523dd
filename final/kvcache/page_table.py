"""The page table: row r lists, in order, the pages holding request r's tokens.

It lives on the device, so the attention kernels and the K/V writes turn (request, position) into
a pool slot without the host building per-token index lists: a step copies over only the pages
it adds, which keeps the host's work per step proportional to the batch, not to sequence lengths.

The last row (`padding_row`) is never handed out: every entry points at the pool's padding page.
A CUDA-graph step padded to a captured batch size gives its padding rows this row.
"""

from __future__ import annotations

import torch


class PageTable:
    def __init__(
        self, max_requests: int, max_pages_per_request: int, device: torch.device, padding_page: int
    ):
        self.table = torch.zeros(max_requests + 1, max_pages_per_request, dtype=torch.int32, device=device)
        self.padding_row = max_requests
        self.table[self.padding_row] = padding_page
        self.free_rows = list(range(max_requests - 1, -1, -1))
        self.max_requests, self.max_pages_per_request = max_requests, max_pages_per_request
        self.device = device
        # Writes are queued on the host and applied in one scatter per step (`flush`): a decode
        # step adds a page to many requests, and one copy beats one tiny copy per request.
        self._rows: list[int] = []
        self._cols: list[int] = []
        self._pages: list[int] = []

    @property
    def num_free_rows(self) -> int:
        return len(self.free_rows)

    def acquire_row(self) -> int:
        return self.free_rows.pop()

    def release_row(self, row: int) -> None:
        self.free_rows.append(row)

    def write(self, row: int, start: int, pages: list[int]) -> None:
        """Record `pages` as the request's pages number start, start+1, ... (applied at `flush`)."""
        self._rows.extend([row] * len(pages))
        self._cols.extend(range(start, start + len(pages)))
        self._pages.extend(pages)

    def pending_writes(self) -> tuple[list[int], list[int], list[int]]:
        """(rows, columns, pages) queued since the last flush: under tensor parallelism rank 0
        sends them with the step, so every rank's copy of the table gets the same writes."""
        return self._rows, self._cols, self._pages

    def queue_writes(self, rows: list[int], cols: list[int], pages: list[int]) -> None:
        """Queue another rank's writes as they are (applied at `flush`)."""
        self._rows.extend(rows)
        self._cols.extend(cols)
        self._pages.extend(pages)

    def flush(self) -> None:
        """Apply the queued writes to the device table: one host-to-device copy."""
        if not self._pages:
            return
        packed = torch.tensor([self._rows, self._cols, self._pages], dtype=torch.int64)
        if self.device.type == "cuda":
            packed = packed.pin_memory()
        rows, cols, pages = packed.to(self.device, non_blocking=True)
        self.table[rows, cols] = pages.to(torch.int32)
        self._rows, self._cols, self._pages = [], [], []

    def slots(self, rows: torch.Tensor, positions: torch.Tensor, page_size: int) -> torch.Tensor:
        """Pool slot of each token, given its request's row and its position: [T] -> [T]."""
        pages = self.table[rows, positions // page_size]
        return pages * page_size + positions % page_size
