"""FlashAttention 4's compiled call replayed (final/attention/fa4_replay.py), on the CPU.

A fake `flash_attn.cute` mirrors the path the replay depends on: `flash_attn_varlen_func` calls
`interface._flash_attn_fwd`, which allocates the output, compiles into
`_flash_attn_fwd.compile_cache` on a new key and calls the kernel there with Hopper's argument
order (interface.py, flash-attn-4 4.0.0b36: q, k, v, out, lse, softmax_scale, cu_seqlens_q,
cu_seqlens_k, seqused_q, seqused_k, page_table, window_size_left, window_size_right,
learnable_sink, block-sparse tensors, AuxData, cu_total_m_blocks, cu_total_splits_m_blocks). Its
kernel computes something of every tensor argument, so a tensor in the wrong place gives another
output. Switches make the interface do per-call work the replay must not skip. The real library
is compared bit for bit in tests/final/attention/test_final_gpu_attention.py.
"""

from __future__ import annotations

import logging
import types
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytest
import torch

from final.attention import fa4_replay, support
from final.attention.fa_backend import FlashAttention4
from final.attention.paged import PagedMetadata

THRESHOLD = 4  # the fake's BIN_BATCH_SEARCH_THRESH
PAGE, KV_HEADS, HEADS, DIM, PAGES = 4, 2, 4, 8, 64
SCALE = DIM**-0.5


class AuxData(NamedTuple):  # interface.py passes AuxData(aux_tensors, aux_scalars)
    tensors: Any = None
    scalars: Any = None


class Cache:
    """Like flash_attn/cute/cache_utils.py's JITCache: a dict `cache` behind [] and `in`."""

    def __init__(self):
        self.cache: dict = {}

    def __getitem__(self, key):
        return self.cache[key]

    def __setitem__(self, key, kernel):
        self.cache[key] = kernel

    def __contains__(self, key):
        return key in self.cache


@dataclass
class Fake:
    """What the fake interface does besides the plain call, and what it counted."""

    scheduler: bool = False  # pass a tensor it computed (as scheduler metadata would be)
    twice: bool = False  # launch the kernel twice in one call
    copy_q: bool = False  # pass an aligned copy of q
    number: bool = False  # pass an integer that follows the step (as max_seqlen_q on Blackwell)
    post: bool = False  # return another tensor than the kernel wrote (work after the kernel)
    fail: bool = False  # raise after the kernel ran
    counts: dict = field(default_factory=lambda: {"interface": 0, "kernel": 0, "compiled": 0})


def kernel(fake: Fake):
    def run(q, k, v, out, lse, scale, cu_q, cu_k, used_q, used_k, table, left, right, sink, sparse, aux,
            cu_total, cu_splits, *more):  # fmt: skip
        fake.counts["kernel"] += 1
        assert q.is_contiguous(), "compiled for the layout the interface makes"
        assert lse is None and cu_k is None and used_q is None and isinstance(aux, AuxData)
        flat_q, flat_out = q.reshape(-1, *q.shape[-2:]), out.view(-1, *out.shape[-2:])
        starts = cu_q.tolist() if cu_q is not None else list(range(table.shape[0] + 1))  # decode: one each
        for i in range(table.shape[0]):
            page = int(table[i, 0])
            row = k[page].sum() + 2 * v[page].sum() + used_k[i]
            flat_out[starts[i] : starts[i + 1]] = flat_q[starts[i] : starts[i + 1]] * scale + row

    return run


def fake_module(fake: Fake) -> types.ModuleType:
    interface = types.ModuleType("flash_attn.cute.interface")
    interface.BIN_BATCH_SEARCH_THRESH = THRESHOLD

    def _flash_attn_fwd(q, k, v, cu_seqlens_q=None, seqused_k=None, page_table=None, softmax_scale=None,
                        causal=False):  # fmt: skip
        fake.counts["interface"] += 1
        # Like FlashAttention 4's maybe_contiguous, stricter: a q not contiguous is copied.
        q = q.clone() if fake.copy_q or not q.is_contiguous() else q.detach()
        k, v = k.detach(), v.detach()
        out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
        batch = page_table.shape[0]
        # Above the threshold the real interface computes a batch lookup aid for varlen queries.
        hint = cu_seqlens_q.cumsum(0) if cu_seqlens_q is not None and batch > THRESHOLD else None
        key = (q.dtype, q.dim(), hint is None)
        if key not in _flash_attn_fwd.compile_cache:
            fake.counts["compiled"] += 1
            _flash_attn_fwd.compile_cache[key] = kernel(fake)
        args = [q, k, v, out.detach(), None, softmax_scale, cu_seqlens_q, None, None, seqused_k, page_table,
                None, None, None, None, AuxData(None, None), hint, None]  # fmt: skip
        if fake.scheduler:
            args[-1] = torch.zeros(batch, dtype=torch.int32)
        if fake.number:
            args[-1] = int(q.shape[0])
        for _ in range(2 if fake.twice else 1):
            _flash_attn_fwd.compile_cache[key](*args)
        if fake.fail:
            raise RuntimeError("the interface failed")
        return (out + 1 if fake.post else out), None

    _flash_attn_fwd.compile_cache = Cache()
    interface._flash_attn_fwd = _flash_attn_fwd

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q=None, seqused_k=None, page_table=None,
                               softmax_scale=None, causal=False):  # fmt: skip
        return interface._flash_attn_fwd(q, k, v, cu_seqlens_q, seqused_k, page_table, softmax_scale, causal)

    module = types.ModuleType("flash_attn.cute")
    module.interface = interface
    module.flash_attn_varlen_func = flash_attn_varlen_func
    return module


@pytest.fixture(autouse=True)
def hopper(monkeypatch):
    monkeypatch.setattr(support, "device_capability", lambda device: (9, 0))


def pages(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(PAGES, PAGE, KV_HEADS, DIM, generator=g), torch.randn(
        PAGES, PAGE, KV_HEADS, DIM, generator=g
    )


def step(query_lens: list[int], seed: int, strided: bool = False) -> tuple[torch.Tensor, PagedMetadata]:
    """Fresh random q, lengths and block table for one step (prefill when any query_len > 1)."""
    g = torch.Generator().manual_seed(seed)
    batch = len(query_lens)
    seq_lens = [q + int(torch.randint(0, 20, (1,), generator=g)) for q in query_lens]
    m = PagedMetadata(
        block_table=torch.randint(0, PAGES, (batch, 8), generator=g, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        max_seqlen_k=max(seq_lens),
    )
    if any(q > 1 for q in query_lens):
        m.cu_seqlens_q = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(query_lens), HEADS, 2 * DIM if strided else DIM, generator=g)
    return q[..., :DIM], m  # strided: q is a view of every other half row


def run(fa: FlashAttention4, query_lens: list[int], seed: int, strided: bool = False) -> torch.Tensor:
    q, m = step(query_lens, seed, strided)
    k, v = pages()
    return (fa.prefill if m.cu_seqlens_q is not None else fa.decode)(q, k, v, m, SCALE)


STEPS = [[5, 1, 17], [2], [30], [2, 2], [9, 1, 1, 3]]  # prefills of at most THRESHOLD requests
DECODES = [[1], [1, 1, 1], [1] * THRESHOLD]


def test_replay_matches_the_official_call_and_skips_the_interface():
    official, replayed = Fake(), Fake()
    fa_official = FlashAttention4(fake_module(official), replay=False)
    fa = FlashAttention4(fake_module(replayed), replay=True)
    results = []
    for seed, query_lens in enumerate(STEPS + DECODES + STEPS + DECODES):
        want, got = run(fa_official, query_lens, seed), run(fa, query_lens, seed)
        assert got.shape == want.shape == (sum(query_lens), HEADS, DIM)
        assert torch.equal(got, want), (seed, query_lens)
        results.append((got, want))
    # Each call wrote a fresh output: a later one overwrote none (the next layer reads it).
    assert all(torch.equal(got, want) for got, want in results)
    calls = 2 * (len(STEPS) + len(DECODES))
    assert official.counts == {"interface": calls, "kernel": calls, "compiled": 2}
    # One official call per kind (prefill, decode), then the kernel alone.
    assert replayed.counts == {"interface": 2, "kernel": calls, "compiled": 2}
    assert sum(r is not None for r in fa.replay.kinds.values()) == 2


def test_a_replay_writes_into_the_buffer_it_is_given():
    """The piecewise prefill hands its static output buffer (`out`): a replayed call writes there
    (the first, official call of a kind returns its own output)."""
    fa = FlashAttention4(fake_module(Fake()), replay=True)
    k, v = pages()
    outs = []
    for seed in range(3):
        q, m = step([5, 1, 17], seed)
        given = torch.full((q.shape[0], HEADS, DIM), 7.0)
        got = fa.prefill(q, k, v, m, SCALE, out=given)
        want = FlashAttention4(fake_module(Fake()), replay=False).prefill(q, k, v, m, SCALE)
        assert torch.equal(got, want)
        outs.append(got.data_ptr() == given.data_ptr())
    assert outs == [False, True, True]


def test_a_batch_above_the_threshold_is_its_own_kind_and_its_computed_aid_keeps_it_official():
    fake = Fake()
    fa = FlashAttention4(fake_module(fake), replay=True)
    ref = FlashAttention4(fake_module(Fake()), replay=False)
    big = [[3] * (THRESHOLD + 1), [1, 2] * THRESHOLD]
    for seed, query_lens in enumerate(STEPS[:2] + big + STEPS[2:] + big):
        assert torch.equal(run(fa, query_lens, seed), run(ref, query_lens, seed))
    assert sorted(r is not None for r in fa.replay.kinds.values()) == [False, True]
    assert fake.counts["interface"] == 1 + 2 * len(big)  # small batches: the first only


@pytest.mark.parametrize("how", ["scheduler", "twice", "copy_q", "number", "post"])
def test_per_call_work_in_the_interface_keeps_the_official_path(how, caplog):
    fake = Fake(**{how: True})
    fa = FlashAttention4(fake_module(fake), replay=True)
    ref = FlashAttention4(fake_module(Fake(**{how: True})), replay=False)
    with caplog.at_level(logging.INFO, logger=fa4_replay.__name__):
        for seed, query_lens in enumerate(STEPS + STEPS):
            assert torch.equal(run(fa, query_lens, seed), run(ref, query_lens, seed))
    assert fake.counts["interface"] == 2 * len(STEPS)
    assert list(fa.replay.kinds.values()) == [None]
    assert len([r for r in caplog.records if "no replay" in r.getMessage()]) == 1  # said once


def test_a_q_the_interface_would_copy_is_its_own_kind():
    fake = Fake()
    fa = FlashAttention4(fake_module(fake), replay=True)
    ref = FlashAttention4(fake_module(Fake()), replay=False)
    for seed, query_lens in enumerate(STEPS + STEPS):
        strided = seed % 2 == 1
        assert torch.equal(run(fa, query_lens, seed, strided), run(ref, query_lens, seed, strided))
    # Contiguous: replayed after its first call; strided: the interface's copy, official for good.
    assert sorted(r is not None for r in fa.replay.kinds.values()) == [False, True]
    assert fake.counts["interface"] == 1 + len(STEPS)


def test_the_real_cache_is_back_even_when_the_official_call_raises():
    fake = Fake(fail=True)
    module = fake_module(fake)
    real = module.interface._flash_attn_fwd.compile_cache
    fa = FlashAttention4(module, replay=True)
    with pytest.raises(RuntimeError, match="the interface failed"):
        run(fa, STEPS[0], 0)
    assert module.interface._flash_attn_fwd.compile_cache is real
    assert len(real.cache) == 1  # compiled through the spy, into the real cache
    assert fa.replay.kinds == {}  # undecided: the next call records again
    fake.fail = False
    run(fa, STEPS[0], 0)
    assert module.interface._flash_attn_fwd.compile_cache is real and len(real.cache) == 1
    assert fake.counts["compiled"] == 1
    assert [type(r) for r in fa.replay.kinds.values()] == [fa4_replay.Replay]


def test_switched_off_never_replays(monkeypatch):
    monkeypatch.setenv(fa4_replay.ENV, "0")
    fake = Fake()
    module = fake_module(fake)
    fa = FlashAttention4(module)
    for seed, query_lens in enumerate(STEPS + STEPS):
        run(fa, query_lens, seed)
    assert fake.counts["interface"] == 2 * len(STEPS) and fa.replay.kinds == {}
    monkeypatch.setenv(fa4_replay.ENV, "1")
    assert FlashAttention4(module).replay.enabled


@pytest.mark.parametrize("capability", [(10, 0), (8, 0), None])
def test_only_hopper_replays(monkeypatch, capability):
    monkeypatch.setattr(support, "device_capability", lambda device: capability)
    fake = Fake()
    fa = FlashAttention4(fake_module(fake), replay=True)
    for seed, query_lens in enumerate(STEPS + DECODES + STEPS):
        run(fa, query_lens, seed)
    assert fake.counts["interface"] == fake.counts["kernel"] == 2 * len(STEPS) + len(DECODES)
    assert fa.replay.kinds == {}


def test_a_library_without_the_interface_it_was_written_for_is_called_plainly():
    module = fake_module(Fake())
    del module.interface.BIN_BATCH_SEARCH_THRESH
    assert not FlashAttention4(module, replay=True).replay.enabled
    plain = types.ModuleType("flash_attn.cute")  # e.g. the stand-in of tests/fixtures
    plain.flash_attn_varlen_func = module.flash_attn_varlen_func
    assert not FlashAttention4(plain, replay=True).replay.enabled
