"""The page table: row r lists, in order, the pages holding request r's tokens.

It lives on the device, so attention kernels and the K/V writes can turn a (request, position)
into a slot in the pool without the host building long index lists every step: only the pages
a step adds are copied over. Neither writing it nor listing a batch's pages makes the host wait
for the GPU (stage 06 schedules the next step while the previous one runs).

Under tensor parallelism every rank keeps its own copy on its own device. Only rank 0's scheduler
edits one: it logs its writes (`write_log`), and the engine sends them to the other ranks with the
next step, which apply them with the same `write`.
"""

from __future__ import annotations

import torch

from stages.common.devices import to_device


class PageTable:
    def __init__(self, max_requests: int, max_pages_per_request: int, device):
        self.table = torch.zeros(max_requests, max_pages_per_request, dtype=torch.int32, device=device)
        self.free_rows = list(range(max_requests - 1, -1, -1))
        self.device = device
        self.write_log: list[tuple[int, int, list[int]]] | None = None  # a list on rank 0 under TP

    def acquire_row(self) -> int:
        return self.free_rows.pop()

    def release_row(self, row: int) -> None:
        self.free_rows.append(row)

    def write(self, row: int, start: int, pages: list[int]) -> None:
        """Record `pages` as the request's pages number start, start+1, ..."""
        self.table[row, start : start + len(pages)] = to_device(pages, self.device, torch.int32)
        if self.write_log is not None:
            self.write_log.append((row, start, list(pages)))

    # --8<-- [start:slots]
    def slots(self, rows: torch.Tensor, positions: torch.Tensor, page_size: int) -> torch.Tensor:
        """Pool slot of each token, given its request's row and its position: [T] -> [T]."""
        pages = self.table[rows, positions // page_size].long()
        return pages * page_size + positions % page_size

    # --8<-- [end:slots]

    # --8<-- [start:pages_of]
    def pages_of(self, rows: torch.Tensor, num_pages: list[int]) -> torch.Tensor:
        """The first num_pages[i] pages of each row, concatenated (FlashInfer's `kv_indices`). The
        host knows how many pages that is, so the device is never asked (no sync, no boolean mask)."""
        device, total = rows.device, sum(num_pages)
        counts = to_device(num_pages, device)
        owner = torch.repeat_interleave(
            torch.arange(len(num_pages), device=device), counts, output_size=total
        )
        first = torch.cumsum(counts, 0) - counts  # where each row's pages start in the output
        column = torch.arange(total, device=device) - first[owner]
        return self.table[rows[owner], column]

    # --8<-- [end:pages_of]
