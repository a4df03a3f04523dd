"""final/kernels' Triton kernels on the CPU: run by Triton's interpreter against their torch
references on fresh random inputs, and compiled for Hopper (sm_90) by Triton's real compiler,
which needs no GPU and catches what the interpreter lets through.

Triton reads TRITON_INTERPRET when it is first imported (its own library functions, tl.sum
among them, are built then), so the interpreter tests run in a process of their own:
`test_kernels_under_the_interpreter` runs this file again with TRITON_INTERPRET=1, where the
tests marked `interpreted` run (and the `compiled` ones skip). The interpreter rounds float32 -> bf16 by truncation and
float32 -> float8 wrongly, so exact comparisons use float16 and the bf16 cases allow one bf16
step; the fp8 store is checked on a GPU (tests/final/kernels/test_final_gpu_kernels.py). Shapes are small:
the interpreter runs one program at a time.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest
import torch

from tests import ROOT

triton = pytest.importorskip("triton", reason="needs Triton (pip install triton; Linux only)")

from final.kernels import gemv, kv_write, qk_norm_rope_kv, sampling, step_metadata  # noqa: E402
from final.models import fused  # noqa: E402

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
BF16_STEP = 2**-7  # one bf16 step, relative
interpreted = pytest.mark.skipif(
    not INTERPRETING, reason="run with TRITON_INTERPRET=1 by test_kernels_under_the_interpreter"
)
compiled = pytest.mark.skipif(INTERPRETING, reason="Triton was imported as its interpreter")


@compiled
def test_kernels_under_the_interpreter():
    """This file's interpreter tests, in a fresh process with TRITON_INTERPRET=1."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not gpu", __file__]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout, run.stdout[-2000:]


def paged_pool(pages: int, page_size: int, heads: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """One layer's pool as slots, poisoned with NaN: a slot the kernel must not touch stays NaN.
    The last page is the padding page."""
    return torch.full(((pages + 1) * page_size, heads, dim), float("nan"), dtype=dtype)


def step_slots(tokens: int, pages: int, page_size: int, padding_rows: int, dtype: torch.dtype):
    """Distinct slots in live pages, then `padding_rows` rows all at the padding page's first slot
    (what a CUDA-graph step's padding rows write)."""
    live = torch.randperm(pages * page_size)[: tokens - padding_rows]
    padding = torch.full((padding_rows,), pages * page_size)
    return torch.cat([live, padding]).to(dtype)


def assert_same_pool(got: torch.Tensor, want: torch.Tensor, page_size: int, atol: float = 0.0) -> None:
    """Equal outside the padding page, NaN where nothing was written; the padding page is garbage."""
    live = slice(0, got.shape[0] - page_size)
    torch.testing.assert_close(got[live].float(), want[live].float(), atol=atol, rtol=0, equal_nan=True)


@interpreted
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_kv_write_matches_index_put(page_size, dtype, slot_dtype):
    torch.manual_seed(page_size)
    tokens, q_heads, kv_heads, dim, pages = 9, 4, 2, 16, 8
    # k and v as the model has them: strided views of the fused qkv projection's output
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * dim).to(dtype)
    k = qkv[:, q_heads * dim : (q_heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    v = qkv[:, (q_heads + kv_heads) * dim :].view(tokens, kv_heads, dim)
    slots = step_slots(tokens, pages, page_size, padding_rows=3, dtype=slot_dtype)
    k_cache, v_cache = (paged_pool(pages, page_size, kv_heads, dim, dtype) for _ in range(2))
    k_want, v_want = k_cache.clone(), v_cache.clone()
    kv_write.triton_store_kv(k_cache, v_cache, slots, k, v)
    kv_write.torch_store_kv(k_want, v_want, slots, k, v)
    assert_same_pool(k_cache, k_want, page_size)
    assert_same_pool(v_cache, v_want, page_size)
    padding_slot = pages * page_size
    assert any(torch.equal(k_cache[padding_slot], k[i]) for i in range(tokens - 3, tokens))


def rope_table(positions: int, dim: int) -> torch.Tensor:
    angles = torch.outer(
        torch.arange(positions, dtype=torch.float32), 1e4 ** -(torch.arange(0, dim, 2) / dim)
    )
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


@interpreted
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("heads_per_program", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_qk_norm_rope_kv_matches_its_reference(monkeypatch, page_size, norm, heads_per_program, dtype):  # fmt: skip
    # 4 heads a program past SMALL_STEP_TOKENS: with 6 query heads the second block is half empty
    monkeypatch.setattr(qk_norm_rope_kv, "SMALL_STEP_TOKENS", 100 if heads_per_program == 1 else 2)
    torch.manual_seed(page_size + norm)
    tokens, q_heads, kv_heads, dim, pages = 7, 6, 2, 16, 8
    qkv = (torch.randn(tokens, (q_heads + 2 * kv_heads) * dim) * 3).to(dtype)
    positions = torch.tensor([0, 5, 17, 1, 63, 0, 0], dtype=torch.int32)  # the last two: padding rows
    slots = step_slots(tokens, pages, page_size, padding_rows=2, dtype=torch.int32)
    weights = (torch.randn(dim).to(dtype), torch.randn(dim).to(dtype)) if norm else (None, None)
    cos_sin = rope_table(64, dim)
    k_cache, v_cache = (paged_pool(pages, page_size, kv_heads, dim, dtype) for _ in range(2))
    k_want, v_want = k_cache.clone(), v_cache.clone()
    args = (q_heads, kv_heads, positions, cos_sin)
    q = qk_norm_rope_kv.triton_qk_norm_rope_kv(qkv, *args, k_cache, v_cache, slots, *weights, 1e-6)
    q_want = qk_norm_rope_kv.torch_qk_norm_rope_kv(qkv, *args, k_want, v_want, slots, *weights, 1e-6)
    # float16: rounding as torch does (the norm's sum may differ in its last bit); bf16: the
    # interpreter truncates, one step of the largest value (|x| < 32 after the norm)
    atol = 0.01 if dtype == torch.float16 else 32 * BF16_STEP
    torch.testing.assert_close(q.float(), q_want.float(), atol=atol, rtol=0)
    assert_same_pool(k_cache, k_want, page_size, atol=atol)
    assert_same_pool(v_cache, v_want, page_size)  # v is copied: exact


def test_fused_reference_equals_the_models_op_by_op_path():
    """The kernel's reference is the model's norm, RoPE and store in one function: in float32 the
    two agree (so the GPU tests, which compare with the reference, test the model's math)."""
    torch.manual_seed(0)
    tokens, q_heads, kv_heads, dim = 5, 4, 2, 32
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * dim)
    positions, cos_sin = torch.tensor([3, 0, 9, 2, 7]), rope_table(16, dim)
    qw, kw = torch.randn(dim), torch.randn(dim)
    slots = torch.tensor([4, 0, 7, 2, 9])
    k_cache, v_cache = torch.zeros(10, kv_heads, dim), torch.zeros(10, kv_heads, dim)
    q = qk_norm_rope_kv.torch_qk_norm_rope_kv(qkv, q_heads, kv_heads, positions, cos_sin, k_cache, v_cache, slots, qw, kw, 1e-6)  # fmt: skip
    q_ref, k_ref, v_ref = qkv.split([q_heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q_ref = fused.torch_rms_norm(q_ref.reshape(tokens, q_heads, dim), qw, 1e-6)
    k_ref = fused.torch_rms_norm(k_ref.reshape(tokens, kv_heads, dim), kw, 1e-6)
    q_ref, k_ref = fused.torch_apply_rope(q_ref, k_ref, positions, cos_sin)
    torch.testing.assert_close(q, q_ref)
    torch.testing.assert_close(k_cache[slots], k_ref)
    torch.testing.assert_close(v_cache[slots], v_ref.reshape(tokens, kv_heads, dim))


@interpreted
@pytest.mark.parametrize(
    "m, n, k, bias, config",
    [
        (1, 64, 96, False, None),
        (2, 50, 300, True, None),  # N not a multiple of a program's rows, K not a power of two
        (3, 33, 200, False, gemv.GemvConfig(4, 64, 2)),  # K over several loop steps
        (4, 130, 1024, True, None),
        (8, 16, 40, False, gemv.GemvConfig(1, 32, 1)),
    ],
)
def test_gemv_matches_f_linear(m, n, k, bias, config):
    torch.manual_seed(m * n)
    x_wide = torch.randn(m, k + 8).half()
    x = x_wide[:, 4 : k + 4]  # a strided view: rows not contiguous with each other
    weight = (torch.randn(n, k) / k**0.5).half()
    b = torch.randn(n).half() if bias else None
    got = gemv.triton_linear(x, weight, b, config)
    want = torch.nn.functional.linear(x.float(), weight.float(), None if b is None else b.float())
    assert got.shape == (m, n) and got.dtype == torch.float16
    torch.testing.assert_close(got.float(), want, atol=2e-3, rtol=2e-3)
    # Into a given buffer's first rows (a decode graph's static logits): the rest left as they were.
    buffer = torch.full((m + 2, n), 7.0).half()
    into = gemv.triton_linear(x, weight, b, config, out=buffer[:m])
    assert into.data_ptr() == buffer.data_ptr() and (buffer[m:] == 7).all()
    torch.testing.assert_close(buffer[:m].float(), want, atol=2e-3, rtol=2e-3)


def random_step_tables(batch: int, page_size: int, padding_rows: int, seed: int):
    """A page table of distinct random pages (its last row the padding row, every entry the padding
    page), a token table, and a decode step: `batch` live rows with random lengths, then
    `padding_rows` rows on the padding row with length 1 (a CUDA graph's padding)."""
    gen = torch.Generator().manual_seed(seed)
    rows_total, width = 12, 9
    pages = torch.randperm(rows_total * width, generator=gen)[: (rows_total - 1) * width].to(torch.int32)
    table = torch.cat([pages.view(rows_total - 1, width), torch.full((1, width), 999, dtype=torch.int32)])
    tokens = torch.randint(0, 50_000, (rows_total,), generator=gen, dtype=torch.int32)
    live = torch.randperm(rows_total - 1, generator=gen)[:batch].to(torch.int32)
    rows = torch.cat([live, torch.full((padding_rows,), rows_total - 1, dtype=torch.int32)])
    lens = torch.randint(1, width * page_size + 1, (batch,), generator=gen, dtype=torch.int32)
    seq_lens = torch.cat([lens, torch.ones(padding_rows, dtype=torch.int32)])
    return table, tokens, rows, seq_lens


@interpreted
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize(("batch", "padding_rows"), [(1, 0), (5, 3), (11, 0)])
def test_step_metadata_kernels_match_their_references(page_size, batch, padding_rows):
    table, tokens, rows, seq_lens = random_step_tables(batch, page_size, padding_rows, seed=batch * page_size)
    size = rows.shape[0]
    got = [torch.full((size,), -7, dtype=torch.int32) for _ in range(3)]  # poisoned: every row written
    want = [torch.empty(size, dtype=torch.int32) for _ in range(3)]
    step_metadata._jit()[0][(-(-size // step_metadata.DECODE_BLOCK),)](
        tokens, table, rows, seq_lens, *got, table.stride(0), size,
        PAGE_SIZE=page_size, BLOCK=step_metadata.DECODE_BLOCK,
    )  # fmt: skip
    step_metadata.torch_decode_inputs(tokens, table, rows, seq_lens, page_size, *want)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    total = int(((seq_lens + page_size - 1) // page_size).sum())
    out = torch.full((total + 4,), -7, dtype=torch.int32)  # room past the end: must stay untouched
    max_pages = int(((seq_lens + page_size - 1) // page_size).max())
    step_metadata._jit()[1][(size, -(-max_pages // 4))](
        table, rows, seq_lens, out, table.stride(0), size,
        PAGE_SIZE=page_size, BLOCK_ROWS=16, BLOCK_PAGES=4,  # several page blocks per row
    )  # fmt: skip
    assert torch.equal(out[:total], step_metadata.torch_kv_indices(table, rows, seq_lens, page_size, total))
    assert torch.equal(out[total:], torch.full((4,), -7, dtype=torch.int32))


def test_step_metadata_references_agree_with_a_loop():
    """The references themselves, against the definition written as a Python loop."""
    table, tokens, rows, seq_lens = random_step_tables(7, 16, 2, seed=3)
    ids, positions, slots = (torch.empty(9, dtype=torch.int32) for _ in range(3))
    step_metadata.torch_decode_inputs(tokens, table, rows, seq_lens, 16, ids, positions, slots)
    pages: list[int] = []
    for i, (row, length) in enumerate(zip(rows.tolist(), seq_lens.tolist(), strict=True)):
        assert (ids[i], positions[i]) == (tokens[row], length - 1)
        assert slots[i] == table[row, (length - 1) // 16] * 16 + (length - 1) % 16
        pages += table[row, : -(-length // 16)].tolist()
    assert step_metadata.torch_kv_indices(table, rows, seq_lens, 16, len(pages)).tolist() == pages


def random_mixed_step(batch: int, page_size: int, seed: int):
    """A step of `batch` requests on the tables of random_step_tables: each computes a random number
    of tokens (a third of them one, as decoding requests do) ending at its length, half of those one-token requests
    reading their token from the table; the host's tokens are random."""
    table, tokens, rows, seq_lens = random_step_tables(batch, page_size, 0, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    query_lens = torch.minimum(torch.randint(1, 40, (batch,), generator=gen, dtype=torch.int32), seq_lens)
    query_lens[torch.rand(batch, generator=gen) < 1 / 3] = 1
    from_table = ((query_lens == 1) & (torch.rand(batch, generator=gen) < 0.5)).to(torch.int32)
    host_ids = torch.randint(0, 50_000, (int(query_lens.sum()),), generator=gen, dtype=torch.int32)
    return table, tokens, rows, query_lens, seq_lens, from_table, host_ids


@interpreted
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("batch", [1, 4, 11])
def test_step_inputs_kernel_matches_its_reference(page_size, batch):
    """An eager step's positions, slots and table tokens, one kernel (blocks of 8 tokens, so a
    request spans several) against the torch ops of torch_step_inputs; outputs poisoned."""
    table, tokens, rows, query_lens, seq_lens, from_table, host_ids = random_mixed_step(batch, page_size, batch + page_size)  # fmt: skip
    total = host_ids.shape[0]
    got = [
        host_ids.clone(),
        torch.full((total,), -7, dtype=torch.int32),
        torch.full((total,), -7, dtype=torch.int32),
    ]
    want = [host_ids.clone(), torch.empty(total, dtype=torch.int32), torch.empty(total, dtype=torch.int32)]
    step_metadata._jit()[2][(batch, -(-int(query_lens.max()) // 8))](
        tokens, table, rows, query_lens, seq_lens, from_table, *got, table.stride(0),
        PAGE_SIZE=page_size, BLOCK_ROWS=16, BLOCK=8,
    )  # fmt: skip
    step_metadata.torch_step_inputs(tokens, table, rows, query_lens, seq_lens, from_table, page_size, *want)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_step_inputs_reference_agrees_with_a_loop():
    """torch_step_inputs against its definition written as a Python loop."""
    table, tokens, rows, query_lens, seq_lens, from_table, host_ids = random_mixed_step(9, 16, seed=5)
    assert from_table.any() and (query_lens > 1).any()  # the case has both kinds of request
    total = host_ids.shape[0]
    ids, positions, slots = (
        host_ids.clone(),
        torch.empty(total, dtype=torch.int32),
        torch.empty(total, dtype=torch.int32),
    )
    step_metadata.torch_step_inputs(
        tokens, table, rows, query_lens, seq_lens, from_table, 16, ids, positions, slots
    )
    t = 0
    for row, q, length, picked in zip(rows.tolist(), query_lens.tolist(), seq_lens.tolist(), from_table.tolist(), strict=True):  # fmt: skip
        for position in range(length - q, length):
            assert positions[t] == position
            assert slots[t] == table[row, position // 16] * 16 + position % 16
            last_from_table = picked and position == length - 1
            assert ids[t] == (tokens[row] if last_from_table else host_ids[t])
            t += 1
    assert t == total


@interpreted
def test_gumbel_max_draws_the_softmax_of_logits_over_temperature(monkeypatch):
    """1,000 rows, each one draw of the same 8 bf16 logits at temperature 0.7: the frequencies are
    softmax(logits / 0.7), within 0.065 (4 standard errors at the top token's 0.56). A temperature
    left out (0.44 there) or the noise -log(u) for -log(-log(u)) (0.66) is 0.1 off."""
    monkeypatch.setattr(sampling, "GUMBEL_BLOCK", 64)  # the interpreter runs a block as numpy arrays
    torch.manual_seed(0)
    vocab, rows, temperature = 8, 1000, 0.7
    row = torch.linspace(-2, 2, vocab)[torch.randperm(vocab)].to(torch.bfloat16)
    logits = row.expand(rows, vocab).contiguous()
    tokens = sampling.triton_gumbel_sample(logits, torch.full((rows,), temperature), torch.tensor([1234]))
    assert tokens.dtype == torch.int64 and tokens.shape == (rows,)
    freq = torch.bincount(tokens, minlength=vocab).float() / rows
    torch.testing.assert_close(freq, (row.float() / temperature).softmax(-1), atol=0.065, rtol=0)


@interpreted
def test_gumbel_max_finds_each_rows_best_chunk_and_follows_its_seed(monkeypatch):
    """A vocabulary of 2,000 cut into chunks of one block of 64: at a temperature far below the
    logits' gaps the draw is the argmax, wherever it lies; the same seed draws the same tokens,
    another seed others."""
    monkeypatch.setattr(sampling, "GUMBEL_BLOCK", 64)
    torch.manual_seed(1)
    rows, vocab = 4, 2000
    assert sampling.gumbel_chunks(rows, vocab, 64)[0] == 32, "the test is about many chunks"
    logits = torch.stack([torch.randperm(vocab).float() for _ in range(rows)])  # distinct, 1 apart
    cold = torch.full((rows,), 1e-3)
    seed = torch.tensor([7])
    assert torch.equal(sampling.triton_gumbel_sample(logits, cold, seed), logits.argmax(-1))
    flat = torch.zeros(rows, vocab)  # every token equally likely: the draw is the noise's
    warm = torch.ones(rows)
    first = sampling.triton_gumbel_sample(flat, warm, seed)
    assert torch.equal(sampling.triton_gumbel_sample(flat, warm, seed), first)
    assert not torch.equal(sampling.triton_gumbel_sample(flat, warm, torch.tensor([8])), first)


@interpreted
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 3])
def test_the_argmax_kernel_is_torchs_argmax_ties_included(monkeypatch, dtype, rows):
    """Chunks of one block of 64 over 1,000 tokens; values from a handful so that every row has
    ties, some across chunks: the first of equal maxima, as torch's argmax; a strided view too."""
    monkeypatch.setattr(sampling, "GUMBEL_BLOCK", 64)
    torch.manual_seed(rows)
    logits = torch.randint(0, 6, (rows, 1000)).to(dtype)
    assert sampling.gumbel_chunks(rows, 1000, 64)[0] > 1
    got = sampling.triton_argmax(logits)
    assert got.dtype == torch.int64 and torch.equal(got, logits.argmax(dim=-1))
    wide = torch.randint(0, 6, (rows, 1200)).to(dtype)[:, 100:1100]  # rows 1,200 apart in memory
    assert torch.equal(sampling.triton_argmax(wide), wide.argmax(dim=-1))


@interpreted
def test_the_sampling_kernel_reads_each_rows_table_entry_and_keeps_greedy_rows_exact(monkeypatch):
    """Rows 0-3 of a batch are requests in table rows 5, 2, 7, 0. Row 0's table temperature is
    far below its logits' gaps (its draw is the argmax); row 1 is greedy by the table (its argmax,
    the first of its tied maxima, whatever the seed); rows 2 and 3 have flat logits and a
    temperature of 1, so their draws are the noise's and move with the seed."""
    monkeypatch.setattr(sampling, "GUMBEL_BLOCK", 64)
    torch.manual_seed(3)
    vocab = 700
    logits = torch.zeros(4, vocab)
    logits[0] = torch.randperm(vocab).float()
    logits[1] = torch.randint(0, 3, (vocab,)).float()  # ties
    rows = torch.tensor([5, 2, 7, 0], dtype=torch.int32)
    temperature = torch.ones(8)
    temperature[5] = 1e-3
    greedy = torch.zeros(8, dtype=torch.bool)
    greedy[2] = True
    draws = [sampling.triton_sample(logits, rows, temperature, greedy, torch.tensor([s])) for s in (1, 2)]
    for got in draws:
        assert got[0] == logits[0].argmax() and got[1] == logits[1].argmax()
    assert not torch.equal(draws[0][2:], draws[1][2:]), "the flat rows follow the seed"


def test_gumbel_max_reference_draws_the_softmax():
    """The torch reference of the trick, on torch's uniforms: the same distribution."""
    torch.manual_seed(2)
    row = torch.linspace(-2, 2, 20)
    n = 20_000
    tokens = sampling.torch_gumbel_sample(row.expand(n, 20), torch.full((n,), 0.5), torch.rand(n, 20))
    freq = torch.bincount(tokens, minlength=20).float() / n
    torch.testing.assert_close(freq, (row / 0.5).softmax(-1), atol=0.015, rtol=0)


def test_dispatch_keeps_the_cpu_on_the_references(monkeypatch):
    """On the CPU every dispatch takes the torch path (Triton serves only CUDA half precision)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a Triton kernel was launched for CPU tensors")

    for module, name in ((kv_write, "triton_store_kv"), (qk_norm_rope_kv, "triton_qk_norm_rope_kv"), (gemv, "triton_linear"), (step_metadata, "_jit")):  # fmt: skip
        monkeypatch.setattr(module, name, refuse)
    x = torch.randn(2, 8).half()
    assert torch.equal(gemv.linear(x, x), torch.nn.functional.linear(x, x))
    monkeypatch.setattr(gemv, "GEMV_MAX_M_BY_WIDTH", ((1 << 30, 8),))
    assert torch.equal(gemv.linear(x, x), torch.nn.functional.linear(x, x))
    cache = torch.zeros(4, 1, 8).half()
    kv_write.store_kv(cache, cache.clone(), torch.tensor([1, 3]), x.view(2, 1, 8), x.view(2, 1, 8))
    assert torch.equal(cache[[1, 3]], x.view(2, 1, 8))


# ---------------------------------------------------------------------------- compiled for sm_90


def compile_for_hopper(kernel, signature: dict[str, str], constants: dict[str, object], warps: int = 4):
    """Triton's full pipeline down to a cubin for sm_90, as a launch on an H100/H200 would run it
    (pointers and 16-divisible integers marked aligned, as Triton specializes them at launch)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(signature)
    aligned = {
        (names.index(a),): [["tt.divisibility", 16]]
        for a, t in signature.items()
        if t.startswith("*") or a.endswith("stride")
    }
    source = ASTSource(kernel, signature, constexprs=constants, attrs=aligned)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})


@compiled
def test_bench_kernels_smoke_run_checks_everything_and_writes_a_valid_result(tmp_path):
    """scripts/bench_kernels.py at toy shapes on the CPU (--smoke): every check passes, and its JSON
    is a result the docs can render (the GPU run writes the same file at the real shapes)."""
    from scripts.results_model import parse_result

    out = tmp_path / "kernels_cpu.json"
    command = [sys.executable, "-m", "scripts.bench_kernels", "--smoke", "--out", str(out)]
    run = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    data = json.loads(out.read_text())
    parse_result(data, out.name)
    assert data["checks"] and all(check["ok"] for check in data["checks"])
    kernels = {row["kernel"] for row in data["rows"]}
    assert kernels == {
        "kv_write",
        "fused_norm_rope_kv",
        "sampling",
        "gemv",
        "decode_inputs",
        "kv_indices",
        "step_inputs",
    }


@compiled
def test_bench_kernels_only_runs_the_parts_asked(tmp_path):
    """`--only` (a GPU call that needs one part, e.g. `gpu_run.sh decode-attn`): those rows only."""
    out = tmp_path / "kernels_cpu.json"
    command = [sys.executable, "-m", "scripts.bench_kernels", "--smoke", "--only", "kv-write", "step-metadata", "--out", str(out)]  # fmt: skip
    run = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    data = json.loads(out.read_text())
    assert {row["kernel"] for row in data["rows"]} == {
        "kv_write",
        "decode_inputs",
        "kv_indices",
        "step_inputs",
    }


def test_the_decode_attention_bench_lays_out_each_row_s_pages():
    """The decode-attention bench's paged layout (scripts/bench_kernels.py, decode_layout): each
    row gets the pages its length needs, the last page holds the rest, no page twice, page 0 free."""
    from scripts.bench_kernels import decode_layout

    page_size, lengths = 16, [1, 16, 17, 512, 300]
    indptr, indices, last = decode_layout(lengths, page_size, "cpu")
    pages = [1, 1, 2, 32, 19]
    assert indptr.tolist() == [0, *itertools.accumulate(pages)]
    assert last.tolist() == [1, 16, 1, 16, 12]
    assert sorted(indices.tolist()) == list(range(1, sum(pages) + 1))
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32


@compiled
def test_kernels_compile_for_hopper():
    const = "constexpr"
    kernels = [
        compile_for_hopper(
            kv_write._jit(),
            {"k_cache": f"*{cache}", "v_cache": f"*{cache}", "slots": "*i32", "k": "*bf16", "v": "*bf16",
             "k_token_stride": "i32", "v_token_stride": "i32", "k_head_stride": "i32", "v_head_stride": "i32",
             "k_scale": "fp32", "v_scale": "fp32", "HEADS": const, "HEAD_DIM": const, "BLOCK_H": const,
             "BLOCK_D": const, "FP8": const},
            {"HEADS": 8, "HEAD_DIM": 128, "BLOCK_H": 8, "BLOCK_D": 128, "FP8": cache == "fp8e4nv"},
        )
        for cache in ("bf16", "fp8e4nv")
    ]  # fmt: skip
    kernels += [
        compile_for_hopper(
            qk_norm_rope_kv._jit(),
            {"qkv": "*bf16", "q_out": "*bf16", "k_cache": f"*{cache}", "v_cache": f"*{cache}", "slots": "*i32",
             "positions": "*i32", "cos_sin": "*fp32", "q_weight": "*bf16", "k_weight": "*bf16",
             "qkv_token_stride": "i32", "eps": "fp32", "k_scale": "fp32", "v_scale": "fp32",
             "NUM_Q_HEADS": const, "NUM_KV_HEADS": const, "HEAD_DIM": const, "BLOCK_HALF": const,
             "HEADS": const, "NORM": const, "FP8": const, "PDL": const},
            {"NUM_Q_HEADS": 16, "NUM_KV_HEADS": 8, "HEAD_DIM": 128, "BLOCK_HALF": 64, "HEADS": heads,
             "NORM": norm, "FP8": cache == "fp8e4nv", "PDL": pdl},
        )
        for heads, norm, cache, pdl in ((1, True, "bf16", True), (4, False, "fp8e4nv", False))
    ]  # fmt: skip
    fused_pdl, fused_plain = kernels[-2:]
    decode_inputs, kv_indices, step_inputs = step_metadata._jit()
    kernels += [
        compile_for_hopper(
            decode_inputs,
            {"token_table": "*i32", "page_table": "*i32", "rows": "*i32", "seq_lens": "*i32", "input_ids": "*i32",
             "positions": "*i32", "out_slots": "*i32", "table_stride": "i32", "size": "i32", "PAGE_SIZE": const,
             "BLOCK": const},
            {"PAGE_SIZE": 16, "BLOCK": step_metadata.DECODE_BLOCK},
        ),
        compile_for_hopper(
            kv_indices,
            {"page_table": "*i32", "rows": "*i32", "seq_lens": "*i32", "out": "*i32", "table_stride": "i32",
             "size": "i32", "PAGE_SIZE": const, "BLOCK_ROWS": const, "BLOCK_PAGES": const},
            {"PAGE_SIZE": 1, "BLOCK_ROWS": step_metadata.KV_ROWS_BLOCK, "BLOCK_PAGES": step_metadata.PAGES_BLOCK},
        ),
        compile_for_hopper(
            step_inputs,
            {"token_table": "*i32", "page_table": "*i32", "rows": "*i32", "query_lens": "*i32", "seq_lens": "*i32",
             "from_table": "*i32", "input_ids": "*i32", "positions": "*i32", "out_slots": "*i32",
             "table_stride": "i32", "PAGE_SIZE": const, "BLOCK_ROWS": const, "BLOCK": const},
            {"PAGE_SIZE": 16, "BLOCK_ROWS": step_metadata.KV_ROWS_BLOCK, "BLOCK": step_metadata.TOKENS_BLOCK},
        ),
    ]  # fmt: skip
    gemvs = [
        compile_for_hopper(
            gemv._jit(),
            {"x": "*bf16", "w": "*bf16", "bias": "*bf16", "y": "*bf16", "M": "i32", "N": "i32",
             "x_row_stride": "i32", "w_row_stride": "i32", "y_row_stride": "i32", "K": const,
             "HAS_BIAS": const, "BLOCK_M": const, "BLOCK_N": const, "BLOCK_K": const, "PDL": const},
            {"K": k, "HAS_BIAS": bias, "BLOCK_M": m, "BLOCK_N": 2, "BLOCK_K": 2048, "PDL": pdl},
        )
        for m, bias, k, pdl in ((1, False, 3072, False), (4, True, 3072, True), (1, False, 2048, True))
    ]  # fmt: skip
    kernels += gemvs
    # The argmax (no noise) gets one unread int32 tensor for its tables and seed, as triton_argmax
    # passes it: the pointer types Triton specializes that launch on.
    sampling_kernels = [
        compile_for_hopper(
            sampling._gumbel_jit(),
            {"logits": "*bf16", "rows": "*i32", "temperature": table_f, "greedy": table_b, "seed": seed,
             "best_value": "*fp32", "best_token": "*i32", "row_stride": "i32", "vocab": "i32",
             "per_chunk": "i32", "chunks": "i32", "NOISE": const, "BLOCK": const},
            {"NOISE": noise, "BLOCK": sampling.GUMBEL_BLOCK},
            warps=8,
        )
        for noise, table_f, table_b, seed in ((True, "*fp32", "*i1", "*i64"), (False, "*i32", "*i32", "*i32"))
    ]  # fmt: skip
    sampling_kernels.append(
        compile_for_hopper(
            sampling._pick_jit(),
            {"best_value": "*fp32", "best_token": "*i32", "tokens": "*i64", "chunks": "i32", "vocab": "i32",
             "BLOCK": const},
            {"BLOCK": sampling.PICK_BLOCK},
        )
    )  # fmt: skip
    kernels = sampling_kernels + kernels
    # The argmax (no noise) draws no random numbers: Philox's multiply-high rounds are not in it.
    assert "mul.hi" in sampling_kernels[0].asm["ptx"] and "mul.hi" not in sampling_kernels[1].asm["ptx"]
    for kernel in kernels:
        assert kernel.asm["cubin"], "no machine code"
    # The GEMV's weight loads are 16-byte vector loads: the point of the kernel is bandwidth.
    assert all("ld.global.v4" in g.asm["ptx"] for g in gemvs)
    # Under programmatic dependent launch it waits for the kernel before it (griddepcontrol.wait)
    # only after its first load of W, and lets the next one launch; without it, neither.
    assert "griddepcontrol" not in gemvs[0].asm["ptx"] and "griddepcontrol" not in fused_plain.asm["ptx"]
    # The fused q/k-norm + RoPE + K/V kernel under it: the wait before the stores of q and of the
    # cache (and before every read of qkv), then the next kernel may launch.
    ptx = fused_pdl.asm["ptx"]
    assert (
        ptx.index("griddepcontrol.wait")
        < ptx.index("griddepcontrol.launch_dependents")
        < ptx.index("st.global")
    )
    for pdl in gemvs[1:]:
        ptx = pdl.asm["ptx"]
        assert (
            ptx.index("ld.global.v4")
            < ptx.index("griddepcontrol.wait")
            < ptx.index("griddepcontrol.launch_dependents")
        )


def test_pdl_needs_hopper_and_triton_and_final_pdl_0_turns_it_off(monkeypatch):
    import final.kernels as kernels

    for capability, env, want in (((9, 0), None, True), ((8, 9), None, False), ((9, 0), "0", False), ((10, 0), "1", True)):  # fmt: skip
        kernels.pdl_available.cache_clear()
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None, c=capability: c)
        if env is None:
            monkeypatch.delenv("FINAL_PDL", raising=False)
        else:
            monkeypatch.setenv("FINAL_PDL", env)
        assert kernels.pdl_available(torch.device("cuda", 0)) is want, (capability, env)
    kernels.pdl_available.cache_clear()
    assert not gemv.use_pdl(torch.zeros(1))  # a CPU tensor: never


def test_the_fused_kernel_launches_with_pdl_only_for_small_steps(monkeypatch):
    """PDL for steps of up to PDL_MAX_TOKENS tokens only (on the H200 the early launch slowed the
    batch-256 step's kernel and the batch-8 step); FINAL_PDL_MAX_TOKENS moves the bound for an A/B."""
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append(
                (grid[0], kwargs.get("launch_pdl", False), kwargs["PDL"])
            )

    monkeypatch.setattr(qk_norm_rope_kv, "_jit", lambda: Recorder())
    monkeypatch.setattr(qk_norm_rope_kv, "use_pdl", lambda x: True)  # a Hopper GPU, as far as it knows
    monkeypatch.delenv("FINAL_PDL_MAX_TOKENS", raising=False)
    qk_norm_rope_kv.pdl_max_tokens.cache_clear()
    q_heads, kv_heads, dim = 2, 1, 8
    k_cache = v_cache = torch.zeros(4, kv_heads, dim)
    bound = qk_norm_rope_kv.PDL_MAX_TOKENS

    def launch(tokens: int) -> None:
        qkv = torch.zeros(tokens, (q_heads + 2 * kv_heads) * dim)
        positions = slots = torch.zeros(tokens, dtype=torch.int64)
        qk_norm_rope_kv.triton_qk_norm_rope_kv(qkv, q_heads, kv_heads, positions, rope_table(4, dim), k_cache, v_cache, slots)  # fmt: skip

    for tokens in (1, bound, bound + 1, 256):
        launch(tokens)
    assert launches == [(1, True, True), (bound, True, True), (bound + 1, False, False), (256, False, False)]
    monkeypatch.setenv("FINAL_PDL_MAX_TOKENS", "256")
    qk_norm_rope_kv.pdl_max_tokens.cache_clear()  # read once a process; a fresh one reads it anew
    launches.clear()
    launch(256)
    assert launches == [(256, True, True)]
    qk_norm_rope_kv.pdl_max_tokens.cache_clear()
