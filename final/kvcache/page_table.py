"""The page table: row r lists, in order, the pages holding request r's tokens.

It lives on the device, so the attention kernels and the K/V writes turn (request, position) into
a pool slot without the host building per-token index lists: a step copies over only the pages
it adds, which keeps the host's work per step proportional to the batch, not to sequence lengths.
"""

from __future__ import annotations

import torch


class PageTable:
    def __init__(self, max_requests: int, max_pages_per_request: int, device: torch.device):
        self.table = torch.zeros(max_requests, max_pages_per_request, dtype=torch.int32, device=device)
        self.free_rows = list(range(max_requests - 1, -1, -1))
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

    def flush(self) -> None:
        """Apply the queued writes to the device table: one host-to-device copy."""
        if not self._pages:
            return
        packed = torch.tensor([self._rows, self._cols, self._pages], dtype=torch.int64)
        rows, cols, pages = packed.to(self.device, non_blocking=True)
        self.table[rows, cols] = pages.to(torch.int32)
        self._rows, self._cols, self._pages = [], [], []

    def slots(self, rows: torch.Tensor, positions: torch.Tensor, page_size: int) -> torch.Tensor:
        """Pool slot of each token, given its request's row and its position: [T] -> [T]."""
        pages = self.table[rows, positions // page_size].long()
        return pages * page_size + positions % page_size

    def pages_of(self, rows: torch.Tensor, num_pages: torch.Tensor, max_pages: int) -> torch.Tensor:
        """The first num_pages[i] pages of each row, concatenated (FlashInfer's `kv_indices`).
        `max_pages` is max(num_pages), passed from the host so no device sync is needed."""
        block = self.table[rows, :max_pages]
        keep = torch.arange(max_pages, device=block.device).unsqueeze(0) < num_pages.unsqueeze(1)
        return block[keep]
