"""Rank 0 tells the other ranks what to compute: each step's batch, over the CPU group.

Only rank 0 schedules. Every other rank runs exactly the batch rank 0 sends, in the order it
sends it, so the ranks cannot disagree on which request sits in which row (Mini-SGLang's ranks
each scheduled for themselves, and had to fix a decode order taken from a Python set: its PR
#113). A step is the scheduler's `StepInput` plus the page-table writes the KV cache manager
queued for it (a new request's pages, a page for a request that grew): every rank keeps its own
copy of the page table on its device, and rank 0's copy is the one the scheduler edits.

The message is a flat list of ints in a fixed-size frame, so a decode step is one broadcast:

    [kind, length, batch B, tokens T, page writes W,
     rows[B], query_lens[B], seq_lens[B], sampled[B], from_table[B], input_ids[T],
     write rows[W], write columns[W], write pages[W]]

A step longer than a frame (a large prefill) sends the rest in a second broadcast.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.forward_batch import StepInput
from .tp import TPInfo

FRAME_INTS = 2048  # 16 KB: a decode step of a few hundred requests fits in one broadcast
HEADER = 5
STEP, SHUTDOWN = 1, 2

PageWrites = tuple[list[int], list[int], list[int]]  # rows, columns, pages


@dataclass
class StepMessage:
    step: StepInput
    page_writes: PageWrites


def encode(step: StepInput, page_writes: PageWrites) -> list[int]:
    rows, cols, pages = page_writes
    b, t, w = step.size, len(step.input_ids), len(pages)
    body = [*step.rows, *step.query_lens, *step.seq_lens, *map(int, step.sampled)]
    body += [*map(int, step.from_table), *step.input_ids, *rows, *cols, *pages]
    return [STEP, HEADER + len(body), b, t, w, *body]


def decode(message: list[int]) -> StepMessage:
    _, _, b, t, w = message[:HEADER]
    at = HEADER

    def take(n: int) -> list[int]:
        nonlocal at
        at += n
        return message[at - n : at]

    rows, query_lens, seq_lens = take(b), take(b), take(b)
    sampled, from_table = [bool(x) for x in take(b)], [bool(x) for x in take(b)]
    step = StepInput(rows, query_lens, seq_lens, sampled, take(t), from_table)
    return StepMessage(step, (take(w), take(w), take(w)))


class StepChannel:
    """`send` on rank 0, `receive` on the others; a rank blocks in `receive` until rank 0 sends."""

    def __init__(self, tp: TPInfo):
        self.tp = tp
        self.frame = torch.zeros(FRAME_INTS, dtype=torch.int64)

    def send(self, step: StepInput, page_writes: PageWrites) -> None:
        self._send(encode(step, page_writes))

    def send_shutdown(self) -> None:
        self._send([SHUTDOWN, HEADER, 0, 0, 0])

    def _send(self, message: list[int]) -> None:
        assert self.tp.is_first, "only rank 0 sends steps"
        head = message[:FRAME_INTS]
        self.frame[: len(head)] = torch.tensor(head, dtype=torch.int64)
        self._broadcast(self.frame)
        if len(message) > FRAME_INTS:
            self._broadcast(torch.tensor(message[FRAME_INTS:], dtype=torch.int64))

    def receive(self) -> StepMessage | None:
        """The next step, or None when rank 0 shuts the engine down."""
        self._broadcast(self.frame)
        kind, length = int(self.frame[0]), int(self.frame[1])
        if kind == SHUTDOWN:
            return None
        if kind != STEP:
            raise RuntimeError(f"unknown message kind {kind} from rank 0")
        message = self.frame[: min(length, FRAME_INTS)].tolist()
        if length > FRAME_INTS:
            rest = torch.empty(length - FRAME_INTS, dtype=torch.int64)
            message += self._broadcast(rest).tolist()
        return decode(message)

    def _broadcast(self, x: torch.Tensor) -> torch.Tensor:
        torch.distributed.broadcast(x, src=0, group=self.tp.cpu_group)
        return x
