"""FlashAttention 4 compiles one kernel per compile key, and its key sees the *kinds* of the
arguments (a tensor's dtype, rank and broadcast dims; any other argument's value), never a
tensor's sizes or contents. So the backend must pass arguments of the same kinds at every step,
whatever the prompts' lengths and the batch's shape: a Python integer that follows the step (as
`max_seqlen_q` did, issue 26) makes the library compile again while serving.

These run the `fa` backend on the CPU over the FlashAttention 4 stand-in, which records the
kinds of every call (tests/fixtures/attention_standins.py); tests/final/attention/test_final_gpu_attention.py
counts the real library's compiled kernels on a GPU.
"""

from __future__ import annotations

import importlib

import pytest

import final
from final.attention.fa_backend import FlashAttentionBackend
from final.attention.libraries import FLASH_ATTENTION_4
from final.core.sampling_params import SamplingParams
from tests.fixtures import attention_standins as standins
from tests.fixtures.paged_batches import (
    attention_config,
    make_batch,
    make_pool_and_table,
    make_qkv,
    scattered_pages,
    write_pages,
)
from tests.fixtures.tiny_models import make_tiny_checkpoint

HOPPER = (9, 0)
PAGE = 4
# Prompt lengths on both sides of every tile edge the library derives flags from (64 and 128
# query rows), and past the engine's prefill budget below (chunked).
LENGTHS = [1, 3, 17, 40, 63, 64, 65, 100, 127, 129, 200]


def distinct_kinds(calls: standins.Calls, kind: str) -> set[tuple]:
    return {
        tuple(sorted(c["compile_kinds"].items(), key=lambda item: item[0]))
        for c in calls.log
        if c["kind"] == kind
    }


def varying(calls: standins.Calls, kind: str) -> dict[str, set]:
    """Each argument whose kind differs between calls of `kind`, with the kinds it took."""
    seen: dict[str, set] = {}
    for call in calls.log:
        if call["kind"] == kind:
            for name, value in call["compile_kinds"].items():
                seen.setdefault(name, set()).add(value)
    return {name: values for name, values in seen.items() if len(values) > 1}


def test_the_recorder_sees_a_length_passed_as_an_integer(monkeypatch):
    """The instrument itself: a call that passes the step's longest query as an int is told apart."""
    calls = standins.install(monkeypatch, HOPPER, "fa4")
    config = attention_config(64, max_context=256)
    pool, table = make_pool_and_table(config, PAGE, 64)
    write_pages(table, scattered_pages(PAGE, [10, 100], 64))
    module = importlib.import_module("flash_attn.cute")
    backend = FlashAttentionBackend(config, pool, table, None, FLASH_ATTENTION_4)
    for n in (10, 100):
        batch = make_batch(table, PAGE, [0], [n], [n])
        backend.prepare(batch)
        q, _, _ = make_qkv(batch, config)
        m = backend.metadata
        module.flash_attn_varlen_func(q, pool.k[0], pool.v[0], cu_seqlens_q=m.cu_seqlens_q, max_seqlen_q=n,
                                      seqused_k=m.seq_lens, page_table=m.block_table, causal=True)  # fmt: skip
    assert set(varying(calls, "varlen")) == {"max_seqlen_q"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("fa_kinds"), "qwen3", head_dim=64)


def test_every_step_passes_flash_attention_4_the_same_kinds(monkeypatch, model_dir):
    calls = standins.install(monkeypatch, HOPPER, "fa4")
    llm = final.LLM(str(model_dir), device="cpu", dtype="float32", attn="fa", page_size=PAGE,
                    max_prefill_length=96, max_running_requests=8, cuda_graph_max_bs=0, num_pages=None)  # fmt: skip
    vocab = llm.config.vocab_size
    prompts = [[(31 * i + 7 * j + 1) % vocab for j in range(n)] for i, n in enumerate(LENGTHS)]
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    for prompt in prompts:  # batch 1: one prefill per length (two chunks past 96 tokens)
        llm.generate([prompt], params, progress=False)
    llm.generate(prompts, params, progress=False)  # ragged batches, chunks beside decodes
    prefills = [c for c in calls.log if c["kind"] == "varlen"]
    assert len({c["seq_lens"] for c in prefills}) >= len(LENGTHS), "too few shapes to judge"
    assert max(len(c["seq_lens"]) for c in prefills) > 1, "no batch of several requests was prefilled"
    assert varying(calls, "varlen") == {}, "an argument of the prefill call changes with the step"
    assert varying(calls, "batched") == {}, "an argument of the decode call changes with the step"
    assert len(distinct_kinds(calls, "varlen")) == len(distinct_kinds(calls, "batched")) == 1


def test_the_prefill_passes_only_what_stays_the_same(monkeypatch):
    """The kernel-level view of the same rule, on hand-built ragged batches: the prefill call's
    non-tensor arguments are exactly the step-independent ones."""
    calls = standins.install(monkeypatch, HOPPER, "fa4")
    config = attention_config(64, heads=8, kv_heads=2, max_context=512)
    seq_lens = [300, 70, 5, 129]
    num_pages = sum(-(-n // PAGE) for n in seq_lens) + 4
    pool, table = make_pool_and_table(config, PAGE, num_pages, rows=4)
    write_pages(table, scattered_pages(PAGE, seq_lens, num_pages))
    backend = FlashAttentionBackend(config, pool, table, None, FLASH_ATTENTION_4)
    batches = [([0], [300], [300]), ([1, 2], [70, 5], [70, 5]), ([3, 0, 2], [64, 1, 5], [129, 300, 5])]
    for rows, query_lens, lens in batches:
        batch = make_batch(table, PAGE, rows, query_lens, lens)
        backend.prepare(batch)
        q, k, v = make_qkv(batch, config)
        backend.forward(0, q, k, v, batch)
    (kinds,) = distinct_kinds(calls, "varlen")
    passed = {name: value for name, value in kinds if value is not None}
    scalars = {name: value for name, value in passed.items() if not isinstance(value, tuple)}
    assert scalars == {"causal": True, "softmax_scale": config.head_dim**-0.5}
    tensors = {name for name, value in passed.items() if isinstance(value, tuple)}
    assert tensors == {"q", "k", "v", "cu_seqlens_q", "seqused_k", "page_table"}
