"""The page table: row r lists, in order, the pages holding request r's tokens.

It lives on the device, so attention kernels and the K/V writes can turn a (request, position)
into a slot in the pool without the host building long index lists every step: only the pages
a step adds are copied over.
"""

from __future__ import annotations

import torch


class PageTable:
    def __init__(self, max_requests: int, max_pages_per_request: int, device):
        self.table = torch.zeros(max_requests, max_pages_per_request, dtype=torch.int32, device=device)
        self.free_rows = list(range(max_requests - 1, -1, -1))
        self.device = device

    def acquire_row(self) -> int:
        return self.free_rows.pop()

    def release_row(self, row: int) -> None:
        self.free_rows.append(row)

    def write(self, row: int, start: int, pages: list[int]) -> None:
        """Record `pages` as the request's pages number start, start+1, ..."""
        self.table[row, start : start + len(pages)] = torch.tensor(pages, dtype=torch.int32).to(
            self.device, non_blocking=True
        )

    # --8<-- [start:slots]
    def slots(self, rows: torch.Tensor, positions: torch.Tensor, page_size: int) -> torch.Tensor:
        """Pool slot of each token, given its request's row and its position: [T] -> [T]."""
        pages = self.table[rows, positions // page_size].long()
        return pages * page_size + positions % page_size

    # --8<-- [end:slots]

    def pages_of(self, rows: torch.Tensor, num_pages: torch.Tensor) -> torch.Tensor:
        """The first num_pages[i] pages of each row, concatenated (FlashInfer's `kv_indices`)."""
        width = int(num_pages.max()) if num_pages.numel() else 0
        block = self.table[rows, :width]
        keep = torch.arange(width, device=block.device).unsqueeze(0) < num_pages.unsqueeze(1)
        return block[keep]
