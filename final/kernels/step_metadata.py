"""A decode step's metadata built on the device by one kernel each, not by a chain of small torch ops.

    decode_inputs   each row's input token (from the token table), position and K/V slot: what a
                    decode step reads, computed inside its CUDA graph from the rows and lengths
    kv_indices      the pages of every row, concatenated (FlashInfer's `kv_indices`), for the
                    attention plan before each replay
    step_inputs     an eager step's positions and K/V slots, token by token, and the input of each
                    request whose token is in the token table: a prefill's (or a mixed step's)
                    metadata, built from the rows and lengths the host sent

Op by op, `decode_inputs` is an index_select, a subtraction, a division, a remainder, a gather and a
multiply-add (with int64 casts for the indexing), `kv_indices` a ceil-division, a cumsum, a
repeat_interleave, an arange and two gathers, and `step_inputs` some twenty such ops: a dozen
launches of a few microseconds each per step, at batch 1 as at batch 256, each costing the host
more than the GPU (a graphed 512-token prefill spent 0.6 ms of its 2.3 ms launch in the runner's
`prepare`, H200, benchmarks/logs/h200x4-2026-11-28-s18). Each kernel here does its whole job in one launch: a program per row,
(or a block of a row's pages) which finds its own place in the output by summing the page counts
of the rows before it (at most a few hundred numbers), so no prefix sum has to be computed first.

The torch functions are the references (the CPU, and where Triton is missing); the tests compare
the kernels with them (tests/final/kernels/test_final_kernels_interpret.py on the CPU, the GPU tests).
"""

from __future__ import annotations

import functools

import torch

from . import next_power_of_2, triton_available


def use_kernels(x: torch.Tensor) -> bool:
    return x.is_cuda and triton_available()


# ---------------------------------------------------------------------------------------- torch


def torch_decode_inputs(
    token_table: torch.Tensor,
    page_table: torch.Tensor,
    rows: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    out_slots: torch.Tensor,
) -> None:
    """Row i decodes its token at position seq_lens[i] - 1: its input is its row's entry of the token
    table, its K/V slot is that position's page (from the page table) times page_size plus the
    offset in the page. Writes `input_ids`, `positions`, `out_slots` [B] in place."""
    torch.index_select(token_table, 0, rows, out=input_ids)
    torch.sub(seq_lens, 1, out=positions)
    pages = page_table[rows, positions // page_size]
    out_slots.copy_(pages * page_size + positions % page_size)


def torch_kv_indices(
    page_table: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor, page_size: int, total: int
) -> torch.Tensor:
    """The first ceil(seq_lens[i] / page_size) pages of each row, concatenated: [total] int32."""
    num_pages = (seq_lens + page_size - 1) // page_size
    owner = torch.repeat_interleave(
        torch.arange(rows.shape[0], device=rows.device), num_pages, output_size=total
    )
    column = torch.arange(total, device=rows.device) - (torch.cumsum(num_pages, 0) - num_pages)[owner]
    return page_table[rows[owner], column]


def torch_step_inputs(
    token_table: torch.Tensor,
    page_table: torch.Tensor,
    rows: torch.Tensor,
    query_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    from_table: torch.Tensor,
    page_size: int,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    out_slots: torch.Tensor,
) -> None:
    """Request i computes query_lens[i] tokens ending at position seq_lens[i] - 1, concatenated in
    request order into [T]: writes each token's position and K/V slot, and where from_table[i] is
    set, request i's last token in `input_ids` becomes its row's entry of the token table (a
    decoding request's input; the host sent a placeholder). `input_ids` holds the host's tokens."""
    total, b = positions.shape[0], rows.shape[0]
    owner = torch.repeat_interleave(torch.arange(b, device=rows.device), query_lens, output_size=total)
    starts = torch.cumsum(query_lens, 0) - query_lens  # each request's first token in [T]
    index = torch.arange(total, device=rows.device)
    positions.copy_((seq_lens - query_lens)[owner] + index - starts[owner])
    token_rows = rows[owner]
    out_slots.copy_(page_table[token_rows, positions // page_size] * page_size + positions % page_size)
    last = index == (starts + query_lens - 1)[owner]
    input_ids.copy_(torch.where(last & (from_table[owner] != 0), token_table[token_rows], input_ids))


# ---------------------------------------------------------------------------------------- Triton


@functools.cache
def _jit():
    """Both kernels, built on first use (Triton is imported here, not with the module)."""
    import triton
    import triton.language as tl

    @triton.jit
    def decode_inputs_kernel(
        token_table,
        page_table,
        rows,
        seq_lens,
        input_ids,
        positions,
        out_slots,
        table_stride,
        size,
        PAGE_SIZE: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = i < size
        row = tl.load(rows + i, mask=inside, other=0).to(tl.int64)
        position = tl.load(seq_lens + i, mask=inside, other=1) - 1
        page = tl.load(page_table + row * table_stride + position // PAGE_SIZE, mask=inside, other=0)
        tl.store(input_ids + i, tl.load(token_table + row, mask=inside, other=0), mask=inside)
        tl.store(positions + i, position, mask=inside)
        tl.store(out_slots + i, page * PAGE_SIZE + position % PAGE_SIZE, mask=inside)

    @triton.jit
    def kv_indices_kernel(
        page_table,
        rows,
        seq_lens,
        out,
        table_stride,
        size,
        PAGE_SIZE: tl.constexpr,
        BLOCK_ROWS: tl.constexpr,
        BLOCK_PAGES: tl.constexpr,
    ):
        me = tl.program_id(0)  # my row; program_id(1): which block of its pages
        others = tl.arange(0, BLOCK_ROWS)
        before = tl.load(seq_lens + others, mask=others < me, other=0)
        start = tl.sum((before + PAGE_SIZE - 1) // PAGE_SIZE, axis=0)  # pages of the rows before mine
        count = (tl.load(seq_lens + me) + PAGE_SIZE - 1) // PAGE_SIZE
        row = tl.load(rows + me).to(tl.int64)
        column = tl.program_id(1) * BLOCK_PAGES + tl.arange(0, BLOCK_PAGES)
        mine = column < count
        page = tl.load(page_table + row * table_stride + column, mask=mine)
        tl.store(out + start + column, page, mask=mine)

    @triton.jit
    def step_inputs_kernel(
        token_table,
        page_table,
        rows,
        query_lens,
        seq_lens,
        from_table,
        input_ids,
        positions,
        out_slots,
        table_stride,
        PAGE_SIZE: tl.constexpr,
        BLOCK_ROWS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        me = tl.program_id(0)  # my request; program_id(1): which block of its tokens
        others = tl.arange(0, BLOCK_ROWS)
        start = tl.sum(tl.load(query_lens + others, mask=others < me, other=0), axis=0)  # tokens before mine
        count = tl.load(query_lens + me)
        first = tl.load(seq_lens + me) - count
        row = tl.load(rows + me).to(tl.int64)
        j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mine = j < count
        position = first + j
        page = tl.load(page_table + row * table_stride + position // PAGE_SIZE, mask=mine, other=0)
        tl.store(positions + start + j, position, mask=mine)
        tl.store(out_slots + start + j, page * PAGE_SIZE + position % PAGE_SIZE, mask=mine)
        target = tl.where(tl.load(from_table + me) != 0, count - 1, -1)  # my last token, if from the table
        token = tl.load(token_table + row) + tl.zeros([BLOCK], dtype=tl.int32)
        tl.store(input_ids + start + j, token, mask=j == target)

    return decode_inputs_kernel, kv_indices_kernel, step_inputs_kernel


DECODE_BLOCK = 128
PAGES_BLOCK = 128
KV_ROWS_BLOCK = 512
TOKENS_BLOCK = 256


def decode_inputs(
    token_table: torch.Tensor,
    page_table: torch.Tensor,
    rows: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    out_slots: torch.Tensor,
) -> None:
    """torch_decode_inputs, in one kernel where it can run (all tensors int32, the page table contiguous)."""
    size = rows.shape[0]
    if not use_kernels(rows) or size == 0:
        torch_decode_inputs(
            token_table, page_table, rows, seq_lens, page_size, input_ids, positions, out_slots
        )
        return
    kernel = _jit()[0]
    kernel[(-(-size // DECODE_BLOCK),)](
        token_table,
        page_table,
        rows,
        seq_lens,
        input_ids,
        positions,
        out_slots,
        page_table.stride(0),
        size,
        PAGE_SIZE=page_size,
        BLOCK=DECODE_BLOCK,
    )


def kv_indices(
    page_table: torch.Tensor,
    rows: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    total: int,
    max_pages: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """torch_kv_indices, in one kernel where it can run. `total` (the sum of the rows' page counts)
    and `max_pages` (the largest) come from the host, which knows the lengths: the output's size and
    the grid need no sync. With `out` (at least `total` long) the pages are written there, e.g.
    straight into a graph's buffer."""
    size = rows.shape[0]
    if not use_kernels(rows) or size == 0:
        pages = torch_kv_indices(page_table, rows, seq_lens, page_size, total)
        if out is None:
            return pages
        out[:total].copy_(pages)
        return out[:total]
    if out is None:
        out = torch.empty(total, dtype=page_table.dtype, device=page_table.device)
    kernel = _jit()[1]
    kernel[(size, -(-max_pages // PAGES_BLOCK))](
        page_table,
        rows,
        seq_lens,
        out,
        page_table.stride(0),
        size,
        PAGE_SIZE=page_size,
        BLOCK_ROWS=max(KV_ROWS_BLOCK, next_power_of_2(size)),  # one compiled kernel up to 512 rows
        BLOCK_PAGES=PAGES_BLOCK,
    )
    return out[:total]


def step_inputs(
    token_table: torch.Tensor,
    page_table: torch.Tensor,
    rows: torch.Tensor,
    query_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    from_table: torch.Tensor,
    page_size: int,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    out_slots: torch.Tensor,
    max_query: int,
) -> None:
    """torch_step_inputs, in one kernel where it can run (int32 tensors, a contiguous page table);
    `max_query`, the longest query (the host knows it), sizes the grid without a sync."""
    size = rows.shape[0]
    if not use_kernels(rows) or size == 0:
        torch_step_inputs(
            token_table, page_table, rows, query_lens, seq_lens, from_table, page_size, input_ids, positions, out_slots
        )  # fmt: skip
        return
    kernel = _jit()[2]
    kernel[(size, -(-max_query // TOKENS_BLOCK))](
        token_table,
        page_table,
        rows,
        query_lens,
        seq_lens,
        from_table,
        input_ids,
        positions,
        out_slots,
        page_table.stride(0),
        PAGE_SIZE=page_size,
        BLOCK_ROWS=max(KV_ROWS_BLOCK, next_power_of_2(size)),  # one compiled kernel up to 512 requests
        BLOCK=TOKENS_BLOCK,
    )
