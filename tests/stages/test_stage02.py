"""Stage 02 invariants: the page allocator and page table never leak or share a page, and a pool
too small for the batch still finishes every request with the same outputs (preemption)."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stages.common.errors import UserError
from stages.common.sampling import SamplingParams
from tests.fixtures.tiny_models import hf_greedy, sample_prompts
from tests.stage_list import load

kv_cache = load("stages.02_paged_kv.kv_cache")
page_table_mod = load("stages.02_paged_kv.page_table")
request_mod = load("stages.02_paged_kv.request")
scheduler_mod = load("stages.02_paged_kv.scheduler")
stage02 = load("stages.02_paged_kv")


class FakeStream:
    def push(self, ids):
        return "", False


def check_pages(sched, allocator, num_pages: int, page_size: int) -> None:
    live = [r for r in sched.running]
    owned = [p for r in live for p in r.pages]
    assert len(owned) == len(set(owned)), "a page is shared by two live requests"
    assert not set(owned) & set(allocator.free_pages), "a live request's page is also free"
    assert len(owned) + allocator.num_free == num_pages, "a page leaked"
    for r in live:  # each running request has room for every token it holds
        assert len(r.pages) * page_size >= r.num_computed  # room for every token whose KV it holds
        row = sched.page_table.table[r.row, : len(r.pages)].tolist()
        assert row == r.pages, "the device page table disagrees with the request's pages"
    rows = [r.row for r in live]
    assert len(rows) == len(set(rows))


@settings(max_examples=60, deadline=None)
@given(
    page_size=st.sampled_from([1, 2, 4]),
    num_pages=st.integers(min_value=24, max_value=80),
    max_running=st.integers(min_value=1, max_value=6),
    requests=st.lists(
        st.tuples(st.integers(1, 30), st.integers(1, 20), st.integers(0, 6)),  # prompt len, max new, arrival
        min_size=1, max_size=12,
    ),
)  # fmt: skip
def test_scheduler_never_leaks_or_shares_pages(page_size, num_pages, max_running, requests):
    allocator = kv_cache.PageAllocator(num_pages)
    table = page_table_mod.PageTable(max_running, 64, "cpu")
    sched = scheduler_mod.Scheduler(allocator, table, page_size, max_running)
    capacity = num_pages * page_size
    pending = [
        request_mod.Request(rid=i, prompt_ids=[1] * p, params=SamplingParams(), max_new_tokens=n, stream=FakeStream())
        for i, (p, n, _) in enumerate(requests) if p + n <= capacity
    ]  # fmt: skip
    arrivals = {r.rid: requests[r.rid][2] for r in pending}
    done = 0
    for step in range(2000):
        for r in pending:
            if arrivals[r.rid] == step:
                sched.add(r)
        batch = sched.schedule()
        if batch is not None:
            for req in batch.requests:  # what the engine does after a forward pass
                req.num_computed = req.seq_len
                req.output_ids.append(7)
                if len(req.output_ids) >= req.max_new_tokens:
                    sched.finish(req)
                    done += 1
        check_pages(sched, allocator, num_pages, page_size)
        if done == len(pending) and step > 6:
            break
    assert done == len(pending), "some request never finished"
    assert allocator.num_free == num_pages  # everything returned
    assert sorted(sched.page_table.free_rows) == list(range(max_running))


def test_tiny_pool_preempts_and_still_matches(tiny_qwen3_dir):
    prompts = sample_prompts(tiny_qwen3_dir, n=6, seed=7)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    expected = hf_greedy(tiny_qwen3_dir, prompts, 40)
    longest = max(len(p) for p in prompts) + 40
    for page_size in (1, 4):
        tiny = stage02.LLM(
            str(tiny_qwen3_dir), device="cpu", dtype="float32", page_size=page_size,
            num_pages=-(-(longest + 8) // page_size) + 2,  # room for about one request at a time
        )  # fmt: skip
        outputs = tiny.generate(prompts, params)
        assert [o.token_ids for o in outputs] == expected
        assert tiny.scheduler.num_preemptions > 0, "the pool was meant to run dry"
        assert tiny.runner.allocator.num_free == tiny.runner.allocator.num_pages


def test_seeded_sampling_is_reproducible_in_a_batch(tiny_llama_dir):
    llm = stage02.LLM(str(tiny_llama_dir), device="cpu", dtype="float32")
    prompts = sample_prompts(tiny_llama_dir, n=4, seed=8)
    params = [
        SamplingParams(temperature=1.0, top_p=0.9, seed=s, max_tokens=16, ignore_eos=True)
        for s in (1, 2, 3, 1)
    ]
    first = [o.token_ids for o in llm.generate(prompts, params)]
    again = [o.token_ids for o in llm.generate(prompts[::-1], params[::-1])][::-1]
    assert first == again  # a seeded request draws the same tokens whatever its batch


def test_oversized_request_is_rejected_not_hung(tiny_qwen3_dir):
    llm = stage02.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", num_pages=16)
    with pytest.raises(UserError, match="pool holds"):
        llm.add_request([5] * 10, SamplingParams(max_tokens=100))
    assert not llm.has_unfinished()
    assert llm.runner.allocator.num_free == 16


attention_mod = load("stages.02_paged_kv.attention")


@pytest.mark.parametrize(
    ("spec", "dtype", "expected"),
    [
        ("auto", torch.bfloat16, ("fi", "fi")),
        ("auto", torch.float32, ("torch", "torch")),  # FlashInfer has no float32 kernels
        ("fi", torch.float16, ("fi", "fi")),
        ("torch,fi", torch.bfloat16, ("torch", "fi")),
        ("fi", torch.float32, "needs --dtype bfloat16"),
        ("torch,fi", torch.float32, "needs --dtype bfloat16"),
    ],
)
def test_attention_choice_follows_device_and_dtype(monkeypatch, spec, dtype, expected):
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))  # as if installed
    if isinstance(expected, str):
        with pytest.raises(UserError, match=expected):
            attention_mod.resolve_names(spec, "cuda", dtype)
    else:
        assert attention_mod.resolve_names(spec, "cuda", dtype) == expected
    assert attention_mod.resolve_names("auto", "cpu", torch.bfloat16) == ("torch", "torch")
